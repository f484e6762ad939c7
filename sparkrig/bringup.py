"""Bringing the pair up and proving it serves: the stack's start order (the workers' waves, the head
after the last), the head's waits (every worker's beacon over the fabric, its own API's boot), the
five serving gates, and what a failed wait says about why (``sparkhost why``, the rank's logs).

The gate logic is files/sparkhost/gate.py (its command lines: sparkrig/gates.py); the operations
that start the ranks in that order are tasks/pair_start.py's."""

from __future__ import annotations

import shlex
from collections.abc import Generator, Sequence
from typing import Any

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.server import Command

from sparkrig import hostpkg
from sparkrig.config.model import Rank, Settings
from sparkrig.failing import fail_host
from sparkrig.gates import gates_passed, parse_gate_lines
from sparkrig.shown import ShownCommand

# ---------------------------------------------------------------------------------------------
# The start order, and what a failed wait runs (pure)
# ---------------------------------------------------------------------------------------------


def worker_waves(s: Settings) -> list[tuple[int, ...]]:
    """The workers' part of the stack's start order (``Stack.start_waves``): one tuple per step,
    each started and seen running before the next; the head starts after the last."""
    return [w for w in s.stack.start_waves(s.nnodes) if 0 not in w]


def workers_in_start_order(s: Settings) -> list[Rank]:
    """Every worker in the order the stack starts them (``worker_waves``)."""
    return [s.ranks[r] for wave in worker_waves(s) for r in wave]


def starts_in_turn(s: Settings) -> bool:
    """True when the workers start one step at a time (more than one worker wave)."""
    return len(worker_waves(s)) > 1


def worker_wait_args(s: Settings, ranks: Sequence[int] | None = None) -> dict[str, Any]:
    """``workers_running``'s arguments for the head waiting on ``ranks`` (default every worker;
    ordered start and rollback alike)."""
    k = s.knobs
    waited = s.workers if ranks is None else tuple(s.ranks[r] for r in ranks)
    return {
        "sparkhost": hostpkg.invocation(k.install_dir),
        "peers": [s.dial(w) for w in waited],
        "port": k.pair_port,
        "timeout": k.pair_grace_s,
        "explain": why_command(s),
    }


def why_command(s: Settings) -> list[str]:
    """argv of ``sparkhost why`` on this rank (files/sparkhost/why.py): what the firewall dropped
    on the fabric and from whom, the fabric addresses, the GID handed over, the peers' beacons
    and the rank's last journal lines; appended to a failed boot wait or rendezvous."""
    return hostpkg.command(
        s.knobs.install_dir, "why", "--unit", f"{s.unit_name}.service",
        "--interface", s.me.fabric_interface, "--peers", ",".join(s.dial(r) for r in s.others),
        "--port", str(s.knobs.pair_port),
    )  # fmt: skip


def explained(command: Sequence[str], explain: Sequence[str] | None) -> StringCommand:
    """``command``, its lines shown as they come (a boot's stages); when it fails, ``explain``
    runs after it (its lines in the failure's output) and the exit status stays the command's."""
    if not explain:
        return ShownCommand(*[QuoteString(a) for a in command])
    script = f"{shlex.join(command)} || {{ rc=$?; {shlex.join(explain)}; exit $rc; }}"
    return ShownCommand("sh", "-c", QuoteString(script))


# ---------------------------------------------------------------------------------------------
# Operations: the head's waits and the gates
# ---------------------------------------------------------------------------------------------


@operation(is_idempotent=False)
def workers_running(
    sparkhost: list[str],
    peers: list[str],
    port: int,
    timeout: int,
    explain: list[str] | None = None,
) -> Generator[Any, None, None]:
    """
    Wait until every peer rank's container runs, as its stop-together beacon on the fabric says.

    Gated on real state, not a sleep: the head starts as soon as the workers answer.

    + sparkhost: argv of the host package (sparkrig/hostpkg.py invocation)
    + peers: fabric IPv4 addresses of the ranks to wait for
    + port: beacon port
    + timeout: seconds before giving up (fails this host)
    + explain: argv run when the wait fails, saying why (``why_command``)
    """
    wait = [*sparkhost, "pair", "wait", "--peers", ",".join(peers), "--port", str(port),
            "--timeout", str(timeout)]  # fmt: skip
    yield explained(wait, explain)


@operation(is_idempotent=False)
def api_serving(command: list[str], explain: list[str] | None = None) -> Generator[Any, None, None]:
    """
    Wait for the head's API to boot, failing early when the container dies or logs an error.

    + command: the gate script's ``wait`` argv (prints one JSON line per boot stage)
    + explain: argv run when the wait fails, saying why (``why_command``): a failing start never
      ends on "container not running" alone
    """
    yield explained(command, explain)


@operation()
def serving_gates_passed(command: list[str], logs: str) -> Generator[Any, None, None]:
    """
    Prove the endpoint answers: /health, /v1/models, a math completion and a forced tool call.

    The gates are read like a fact (a completion changes nothing), so a healthy endpoint makes
    this a no-op and a re-run reports no changes; a failing gate fails the head with its detail.

    + command: the gate script's ``gates`` argv (prints one JSON line per gate)
    + logs: where to read why, appended to a failure (``logs_to_read``)
    """
    output = host.get_fact(Command, command=shlex.join(command) + " 2>&1 || true") or ""
    results = parse_gate_lines(output)
    report = "; ".join(f"{r.gate} {'ok' if r.ok else 'FAILED'} ({r.detail})" for r in results)
    if results and gates_passed(results):
        host.noop(f"every gate passes: {report}")
        return
    if not host.state.is_executing:
        logger.info(f"{host.print_prefix}gates before this run: {report or 'no answer'}")
        yield StringCommand(*[QuoteString(a) for a in command])
        return
    said = report or output.strip() or "no answer from the gate script"
    yield fail_host(f"serving gates failed: {said}; {logs}")


def logs_to_read(s: Settings) -> str:
    """Where an operator reads why this rank does not serve: its unit and its container."""
    return (
        f"read why on {s.me.name}: `sudo journalctl -u {s.unit_name} -n 200` (the serving "
        f"unit) and `sudo docker logs --tail 200 {s.container_name}` (vLLM)"
    )
