"""The `tensorfold` stack on the lab (issue 34): a converged pair switched to TensorFold, its gates
passing through the authenticating front, 401 without the key, rank 1 opening no HTTP, the
engine on the head's loopback only, the watchdog restarting a wedged TensorFold rank pair from
TensorFold's own /health counters, and the switch back to the default stack.

Each rank runs the `tensorfold-0.6` flavour's stand-in (lab/standin_tensorfold.py: TensorFold
0.6.0's CLI, /health JSON and `tensorfold:` metrics, no key of its own) through the image's
`tensorfold` wrapper; the stack's fake Hub repos are lab/fakehub.py's. Needs the API front (the
front helper's nginx, knob engine_port, default 8001) merged. Ordered: each test builds on the
state the previous one left. Not run by the helper that wrote it (the lab belongs to the lead).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest
from sparkhost import wedge

from bench.chaos.draw import plan
from bench.chaos.runner import campaign
from lab.guest import API_KEY, CURL, HEAD_API
from tests.lab.conftest import ROOT, Lab, pyinfra
from tests.lab.test_lab import (
    INTERVAL_S,
    STALL_S,
    TIMES,
    back_serving,
    chat_in_background,
    cursor,
    guest_clock,
    journal_after,
    stall_rule_fired,
    wait_for,
    watchdog_probing,
)
from tests.lab.test_lab_chaos import ONLY as CHAOS_KINDS
from tests.lab.test_lab_chaos import SEED as CHAOS_SEED
from tests.lab.test_lab_stack_switch import (
    FLAVOUR,
    INV,
    assert_serves,
    flavour,
    gates_pass,
    lab_state,
    running_image,
)

pytestmark = pytest.mark.lab
STACK = "tensorfold"
ENGINE_PORT = 8001  # the front's knob engine_port (default): the engine's loopback port
FLAVOUR.setdefault(STACK, "tensorfold-0.6")  # assert_serves reads the flavour table


def tf_health(head) -> wedge.Sample:
    """TensorFold's /health on the head's loopback, read as the watchdog reads it."""
    text = head.sh(f"curl -s -m 10 http://127.0.0.1:{ENGINE_PORT}/health")
    return wedge.parse_tensorfold_health(text)


def http_code(guest, url: str, key: bool = False) -> str:
    auth = f' -H "Authorization: Bearer $(cat {API_KEY})"' if key else ""
    return guest.sh(f"{CURL} -s -m 10 -o /dev/null -w '%{{http_code}}'{auth} {url}").strip()


def listening_ports(guest) -> str:
    """The TCP ports the rank container's engine process listens on (`ss`, by its PID)."""
    pid = guest.sh(f"docker inspect --format '{{{{.State.Pid}}}}' {guest.container}").strip()
    return guest.sh(f"ss -Hltnp | grep 'pid={pid},' || true").strip()


def test_tensorfold_converged_on_the_default_stack_first(lab: Lab):
    r = pyinfra("-y", INV, "deploy.py")
    assert r.rc == 0, r.output[-6000:]
    assert_serves(lab, "vllm-nvfp4")


def test_switch_to_tensorfold_gates_pass_through_the_front_and_rank_1_serves_no_http(lab: Lab):
    r = pyinfra("-y", INV, "deploy.py", "--data", f"stack={STACK}")
    assert r.rc == 0, r.output[-6000:]
    assert_serves(lab, STACK)  # every rank the tensorfold-0.6 stand-in; the four gates pass
    head, worker = lab.head, lab.workers[0]
    digest = lab_state()["stack_images"][STACK].rpartition("sha256:")[2]
    assert running_image(head).endswith(f"base-{digest}")
    # the key: the front answers 401 without it, the engine's answer with it
    assert http_code(head, f"{HEAD_API}/v1/models") == "401"
    assert http_code(head, f"{HEAD_API}/v1/models", key=True) == "200"
    # the engine: loopback on the head only, no key of its own; rank 1 listens on nothing
    assert f"127.0.0.1:{ENGINE_PORT}" in listening_ports(head)
    assert f"0.0.0.0:{ENGINE_PORT}" not in listening_ports(head)
    assert http_code(head, f"http://127.0.0.1:{ENGINE_PORT}/v1/models") == "200"
    assert listening_ports(worker) == "", listening_ports(worker)
    # the watchdog reads TensorFold's /health counters on the engine's port
    unit = head.sh("systemctl cat sparkrig-watchdog")
    assert f"--metrics-url http://127.0.0.1:{ENGINE_PORT}/health" in unit
    assert "--progress-parser tensorfold-health" in unit
    sample = tf_health(head)
    assert sample.generation_tokens > 0  # the gates' completions were counted
    dry = pyinfra("--dry", INV, "deploy.py", "--data", f"stack={STACK}")
    assert dry.rc == 0, dry.output[-4000:]
    assert "Will change" not in dry.output and "Will create" not in dry.output, dry.output[-4000:]


def test_a_wedged_tensorfold_rank_pair_is_restarted_by_the_watchdog(lab: Lab):
    """A request decodes, rank 0 wedges under it: /health stays ok, its counters stop; the stall
    rule (the same rule, TensorFold's counters) fires within stall_s plus one interval and the
    pair (both ranks, in order) serves again."""
    head = lab.head
    assert flavour(head) == FLAVOUR[STACK]
    watchdog_probing(head)
    before = head.unit_started("sparkrig-head")
    mark = cursor(head)
    chat_in_background(head, "tf-decoding", "'tell a story'", 600, max_tokens=20000,
                       ignore_eos=True)  # fmt: skip
    last: list[wedge.Sample] = []

    def decoding() -> bool:
        seen = tf_health(head)
        moved = bool(last) and seen.generation_tokens > last[-1].generation_tokens
        last.append(seen)
        return moved and seen.running == 1

    wait_for("the request decodes", decoding, 120)
    start = time.monotonic()
    head.sh("docker kill -s USR1 sparkrig-rank0 >/dev/null")
    wedged_at = guest_clock(head)
    body = head.sh(f"curl -s -m 10 http://127.0.0.1:{ENGINE_PORT}/health")
    assert json.loads(body)["ok"] is True  # what TensorFold's /health says of a wedged engine
    frozen = tf_health(head)
    time.sleep(2)
    assert tf_health(head) == frozen and frozen.running == 1, frozen
    took, _ = stall_rule_fired(head, mark, wedged_at)
    print(f"tensorfold wedge -> stall rule fired: {took:.0f} s (stall_s {STALL_S})")
    assert took <= STALL_S + INTERVAL_S + 10, f"{took:.0f} s"
    what = "a wedged TensorFold pair, restarted by the watchdog"
    back_serving(lab, what, start, before)
    assert "restarting the pair in order" in journal_after(head, mark, "sparkrig-watchdog")
    print(f"wedge to serving again: {TIMES[what]:.0f} s")
    assert_serves(lab, STACK)
    gates_pass(lab)


def test_chaos_sample_on_tensorfold_heals_in_one_run_each(lab: Lab):
    """CI's chaos sample (tests/lab/test_lab_chaos.py's seed and kinds), every run and --dry
    with `--data stack=tensorfold`: the same three faults healed by one run each."""
    draws = plan(CHAOS_SEED, 3, CHAOS_KINDS)
    out = ROOT / ".lab" / "chaos" / f"ci-seed{CHAOS_SEED}-{STACK}"
    shutil.rmtree(out, ignore_errors=True)
    command = (f"python3 -m bench.chaos --seed {CHAOS_SEED} --faults 3 --no-up "
               f"--only {','.join(CHAOS_KINDS)} --data stack={STACK}")  # fmt: skip
    result = campaign(draws, CHAOS_SEED, CHAOS_KINDS, out, command, up=False, converge=True,
                      data=[f"stack={STACK}"])  # fmt: skip
    print(result.markdown())
    assert not result.stopped, result.stopped
    assert result.healed() == result.total() == 3, result.markdown()
    assert_serves(lab, STACK)


def bench(*args: str) -> str:
    """One `python3 -m sparkrig.bench` run against the lab's head, as an operator runs it."""
    run = subprocess.run(
        [sys.executable, "-m", "sparkrig.bench", "--inventory", INV, "--stack", STACK, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    print(run.stdout)
    return run.stdout


def test_the_bench_shows_tensorfolds_published_figures_beside_its_measured_ones(lab: Lab):
    """Seed 004's protocol and seed 000's (cut short: the stand-in's speed is not the engine's)
    on the TensorFold pair: each table names the figures TensorFold's publishers report, seed
    004's (35.8 tok/s prose, prefill 1,342) and MiaAI's (60.4 alone, 108.8 at 4 streams,
    prefill about 1,950)."""
    out = ROOT / ".lab" / "bench-tensorfold"
    out.mkdir(parents=True, exist_ok=True)
    seed004 = bench("--protocol", "seed004", "--json", str(out / "seed004.json"))
    assert "35.8" in seed004 and "1342" in seed004, seed004
    short = ("--repeats", "1", "--prompts", "2", "--streams", "4", "--contexts", "8K")
    seed000 = bench("--json", str(out / "seed000.json"), *short, "--fffd-tokens", "0", "--no-tool")
    assert "60.4" in seed000 and "108.8" in seed000, seed000


def test_switch_back_from_tensorfold_to_the_default_stack(lab: Lab):
    r = pyinfra("-y", INV, "deploy.py")
    assert r.rc == 0, r.output[-6000:]
    assert_serves(lab, "vllm-nvfp4")
