"""`pyinfra inventory.py status.py`: read-only, one line per rank and one for the pair's gates.

Per rank, ONE remote command (sparkrig.status.RankStatus) reads the unit's state and since when,
the image the rank runs against the one the deploy would run, the GID index (env file, live table,
and what the start gate handed over), the fabric MTU, the weights' commit and when the stamp DB was
last written, and MemFree. The head adds the five serving gates (the gate script; a completion
changes nothing). A rank with anything off fails alone with a message naming it, so the run exits
non-zero; `--limit worker` reads the workers alone. Nothing on a host changes, ever: the only
command that is not a read is `printf ... >&2; exit 1`. The head adds the restarts its supervisor
and watchdog used in their windows (they write their budget to /run/sparkrig) and the watchdog's
last probe (sparkhost.wedge), and MemFree is judged against the start gate's floor when a rank is
down. Each rank adds its firewall's drop counters (a second read: ``nft list table``); the table
missing while the knob firewall is on is off. A rank with anything off adds what explains it
(``sparkhost why``: the sources its firewall dropped on the fabric, its fabric addresses, the
GID handed over, the peers' beacons, its journal), as a failed start prints it. An inventory of
several pairs (host data ``pair``) prints each pair's: every line of a rank begins with its pair's
name, and each head says its own pair's gates (``<pair> gates:``, ``<pair> helpers:``)."""

import shlex
import time

from pyinfra import host, logger
from pyinfra.facts.server import Command

from sparkrig.bringup import why_command
from sparkrig.config.inventory import current
from sparkrig.failing import problems_absent
from sparkrig.firewall import FirewallCounters, counter_problems, counters_line
from sparkrig.front import front_gate_command
from sparkrig.gates import gates_passed, parse_gate_lines
from sparkrig.image import serving_image
from sparkrig.paths import paths
from sparkrig.status import (
    RankStatus,
    baseline_line,
    baseline_problems,
    budget_line,
    budget_problems,
    fact_args,
    line,
    probe_line,
    problems,
    without_confirmation,
)

# Read-only (tests/plan/test_status.py only_reads): pyinfra's "Press enter to execute..." would
# confirm nothing and, with stdin closed (cron, a pipe), end in EOFError; it is skipped here.
without_confirmation()
settings = current()
host_paths = paths(settings)
who = f"{settings.pair} " if settings.pair else ""  # a named pair's lines begin with its name
pair_label = settings.pair or "pair"
state = host.get_fact(
    RankStatus,
    **fact_args(settings, host_paths.env_file, host_paths.gid_env, host_paths.run_dir),
)
now = time.time()
age = now - state.weights_verified
verified = f"{age / 3600:.1f} h ago" if state.weights_verified else "never"
off = problems(settings, state, serving_image(settings))
logger.info(f"{host.print_prefix}{who}{line(settings, state, verified)}")
logger.info(f"{host.print_prefix}{who}rank{settings.me.rank} {baseline_line(state)}")
off += baseline_problems(state)
# the firewall's drop rules, each with what it dropped since the table was loaded
counters = host.get_fact(FirewallCounters)
logger.info(
    f"{host.print_prefix}{who}rank{settings.me.rank} "
    f"{counters_line(settings.knobs.firewall, counters)}"
)
off += counter_problems(settings.knobs.firewall, counters)
# a rank with anything off: what explains it, as a failed start prints it (sparkhost why)
if off:
    why = host.get_fact(Command, command=shlex.join(why_command(settings)) + " 2>&1 || true")
    for finding in (why or "").splitlines():
        logger.info(f"{host.print_prefix}{who}rank{settings.me.rank} {finding}")

if settings.me.is_head:
    knobs = settings.knobs
    command = front_gate_command(settings)
    output = host.get_fact(Command, command=shlex.join(command) + " 2>&1 || true") or ""
    results = parse_gate_lines(output)
    report = "; ".join(f"{r.gate} {'ok' if r.ok else 'FAILED'}" for r in results)
    logger.info(f"{host.print_prefix}{pair_label} gates: {report or 'no answer'}")
    if not (results and gates_passed(results)):
        off.append(f"serving gates: {report or 'no answer from the gate script'}")
    helpers = budget_line(state, knobs.watchdog, now) + probe_line(state, knobs.watchdog, now)
    logger.info(f"{host.print_prefix}{pair_label} helpers: {helpers}")
    off += budget_problems(state, now)

problems_absent(
    name="Report what is off on this rank",
    problems=off,
    heading="status: off",
    passed="status: nothing is off",
)
