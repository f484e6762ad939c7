"""bench/chaos without the lab: the seed's sequence, the catalogue against issue 27's list, the
report's arithmetic, the changed-operations parser on real pyinfra output, the restart rule."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.chaos import __main__ as chaos_main
from bench.chaos import checks, pyinfra_output
from bench.chaos.catalogue import CATALOGUE, KILL_RUN, PAIR, SELF_HEAL, SSH_CUT, WORK
from bench.chaos.draw import CUT_AFTER_S, CUT_FOR_S, KILL_AFTER_S, kinds_allowed, plan
from bench.chaos.report import HEALED, NOT_HEALED, REFUSED, Campaign, FaultResult
from bench.chaos.runner import draw_values, placeholders

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = Path(__file__).parent / "data" / "pyinfra-output"

# Issue 27, "The catalogue, at least", one entry per fault it names (the owned files and the
# weights flip split as the issue lists them), as each fault's `covers` says it.
ISSUE_27 = [
    "fabric MTU reset",
    "GID renumbered",
    "fabric address flushed",
    "RDMA device removed",
    "swappiness changed live and its file deleted",
    "an owned file edited (unit)",
    "an owned file edited (env)",
    "an owned file edited (netplan)",
    "an owned file edited (sysctl)",
    "/etc/sparkrig removed",
    "a weights byte flipped on a worker",
    "a weights byte flipped on the head",
    "a stale .part",
    "the base image removed",
    "the patched image removed",
    "a rank's container killed",
    "a container frozen (docker pause)",
    "docker stopped",
    "docker restarted",
    "one node rebooted",
    "the control process SIGKILLed mid-run, then run again",
    "the SSH connection to one node cut mid-run, then run again",
    "the disk where weights live filled to 100%",
]
# "A fault the deploy must refuse rather than heal (a foreign claim on the fabric NIC, a full
# disk)": exactly these are marked refused.
REFUSED_KINDS = {"disk-full", "fabric-claimed-netplan", "fabric-claimed-nm", "clock-skew"}
BOUNDS = {"kill_after_s": KILL_AFTER_S, "cut_after_s": CUT_AFTER_S, "cut_for_s": CUT_FOR_S}


def sequence(seed: int, faults: int, only: tuple[str, ...] = ()) -> list[tuple]:
    return [(d.kind, d.node, sorted(d.params.items())) for d in plan(seed, faults, only)]


def test_a_seed_draws_the_same_sequence_in_any_process_and_another_seed_another():
    mine = sequence(2027, 50)
    code = (
        "import json; from bench.chaos.draw import plan; print(json.dumps([(d.kind, d.node, "
        "sorted(d.params.items())) for d in plan(2027, 50)]))"
    )
    for hashseed in ("1", "4242"):  # string hashing differs: no set order may leak into a draw
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": hashseed},
        )  # fmt: skip
        theirs = [(k, n, [tuple(p) for p in ps]) for k, n, ps in json.loads(out.stdout)]
        assert theirs == mine
    assert sequence(2027, 50) == mine
    assert sequence(2028, 50) != mine
    assert sequence(2027, 10) == mine[:10]  # a shorter campaign is the longer one's beginning


def test_rounds_hit_every_kind_equally_and_only_restricts_the_draw():
    kinds = [f.kind for f in CATALOGUE]
    counts = Counter(kind for kind, _, _ in sequence(7, 2 * len(kinds)))
    assert counts == dict.fromkeys(kinds, 2)
    only = ("docker-stopped", "docker-restarted")
    assert {kind for kind, _, _ in sequence(7, 9, only)} == set(only)
    with pytest.raises(ValueError, match="no such fault kind: docker-exploded"):
        kinds_allowed(["docker-exploded"])


def test_draws_pick_their_parameters_in_bounds():
    for d in plan(11, 200):
        assert d.node in ("head", "worker")
        if d.fault.target != "any":
            assert d.node == d.fault.target
        assert set(d.params) == set(d.fault.params), d
        if "frac" in d.params:
            assert 0.0 < float(d.params["frac"]) < 1.0
        if "work" in d.params:
            assert d.params["work"] in WORK
        for key, (low, high) in BOUNDS.items():
            if key in d.params:
                assert low <= int(d.params[key]) <= high


def test_the_catalogue_holds_every_fault_issue_27_names():
    covers = [f.covers for f in CATALOGUE]
    missing = [item for item in ISSUE_27 if item not in covers]
    assert missing == [], f"issue 27 faults without a catalogue entry: {missing}"
    assert len({f.kind for f in CATALOGUE}) == len(CATALOGUE)
    assert {f.kind for f in CATALOGUE if f.refused} == REFUSED_KINDS
    assert {f.kind for f in CATALOGUE if "docker" in f.kind} == {
        "docker-stopped",
        "docker-restarted",
    }


def test_the_catalogue_holds_the_faults_of_the_layers_interplay():
    """Issue 47: the extra fabric address, a rank's clock ahead, the front killed, the API key
    deleted; the front's kill is the drop-in's to heal by itself."""
    kinds = {f.kind: f for f in CATALOGUE}
    for kind in ("fabric-extra-address", "clock-skew", "front-killed", "api-key-deleted"):
        assert kind in kinds, kind
    assert kinds["front-killed"].mode == SELF_HEAL
    assert kinds["fabric-extra-address"].target == "worker"


def test_every_placeholder_a_fault_uses_is_filled():
    _, values = placeholders(None)
    for d in plan(5, 2 * len(CATALOGUE)):
        filled = draw_values(values, d)
        f = d.fault
        commands = [f.apply, f.undo]
        if f.mode in (KILL_RUN, SSH_CUT):
            work = next(w for w in CATALOGUE if w.kind == d.params["work"])
            commands.append(work.apply)
        for command in commands:
            left = set(re.findall(r"(?<!\{)\{(\w+)\}(?!\})", command)) - set(filled)
            assert left == set(), f"{f.kind}: {left} never filled"
        assert f.apply or f.mode == KILL_RUN, f.kind
    for kind in WORK:  # a killed or cut run needs work that restarts the pair
        assert next(f for f in CATALOGUE if f.kind == kind).restarts == PAIR


def result(index: int, kind: str, verdict: str, seconds: float | None = None) -> FaultResult:
    return FaultResult(index, kind, "lab-head", {}, verdict, [] if verdict != NOT_HEALED else
                       ["lab-head: fabric MTU 1500, want 9000"], [], seconds,
                       log=f"/tmp/{index:02d}-{kind}.log")  # fmt: skip


def test_the_report_counts_healed_and_refused_and_every_drawn_fault_in_the_total():
    c = Campaign(9, 5, [], "python3 -m bench.chaos --seed 9 --faults 5", "now")
    c.results = [
        result(1, "docker-stopped", HEALED, 150.0),
        result(2, "fabric-claimed-nm", REFUSED),
        result(3, "fabric-mtu-reset", NOT_HEALED),
        result(4, "docker-stopped", HEALED, 250.0),
    ]  # the fifth was never run (the campaign stopped)
    c.stopped = "after fault 3 one recovery run left the pair not whole"
    assert (c.healed(), c.total()) == (3, 5)
    assert [r.index for r in c.not_healed()] == [3]
    assert c.per_kind()["docker-stopped"] == {"n": 2, "healed": 2, "median_s": 200, "worst_s": 250}
    md = c.markdown()
    assert "**healed 3/5**" in md
    assert "1 drawn fault(s) not run." in md
    assert "- 3. fabric-mtu-reset on the lab-head: NOT healed; lab-head: fabric MTU 1500" in md
    assert "(log: /tmp/03-fabric-mtu-reset.log)" in md
    js = c.to_json()
    assert (js["healed"], js["total"]) == (3, 5)
    assert [(n["index"], n["log"]) for n in js["not_healed"]] == [
        (3, "/tmp/03-fabric-mtu-reset.log")
    ]


def _part(tmp_path: Path, name: str, seed: int, results: list[FaultResult], drawn: int = 5) -> Path:
    """A --pick part as the runner writes it: ``faults`` counts the faults it ran."""
    command = f"python3 -m bench.chaos --seed {seed} --faults {drawn} --pick {name}"
    c = Campaign(seed, len(results), [], command, name)
    c.results = results
    out = tmp_path / name
    out.mkdir()
    c.write(out)
    return out


def test_parts_of_one_sequence_merge_into_one_report_where_a_replay_replaces_its_fault(
    tmp_path, capsys
):
    a = _part(tmp_path, "1-3", 9, [result(1, "docker-stopped", HEALED, 150.0),
                                   result(2, "fabric-mtu-reset", NOT_HEALED),
                                   result(3, "fabric-claimed-nm", REFUSED)])  # fmt: skip
    b = _part(tmp_path, "2,4,5", 9, [result(2, "fabric-mtu-reset", HEALED, 120.0),
                                     result(4, "docker-stopped", HEALED, 250.0),
                                     result(5, "fabric-mtu-reset", HEALED, 180.0)])  # fmt: skip
    out = tmp_path / "whole"
    assert chaos_main.main(["--merge", str(a), "--merge", str(b), "--out", str(out)]) == 0
    js = json.loads((out / "report.json").read_text())
    assert (js["healed"], js["total"], js["not_healed"]) == (5, 5, [])
    assert [(r["index"], r["verdict"]) for r in js["results"]] == [
        (1, HEALED), (2, HEALED), (3, REFUSED), (4, HEALED), (5, HEALED)
    ]  # fmt: skip
    assert js["per_kind"]["fabric-mtu-reset"] == {
        "n": 2, "healed": 2, "median_s": 150, "worst_s": 180
    }  # fmt: skip
    assert "faults 1-3 from: python3 -m bench.chaos --seed 9 --faults 5 --pick 1-3" in js["command"]
    assert "faults 2,4-5 from:" in js["command"]
    assert "**healed 5/5**" in (out / "report.md").read_text()
    # the replay first, the part it replays after: the older verdict wins, and counts against
    assert chaos_main.main(["--merge", str(b), "--merge", str(a), "--out", str(out)]) == 1
    assert "- 2. fabric-mtu-reset on the lab-head: NOT healed" in capsys.readouterr().out


def test_parts_of_another_sequence_or_no_report_refuse_to_merge(tmp_path):
    a = _part(tmp_path, "a", 9, [result(1, "docker-stopped", HEALED, 150.0)])
    for other in (
        _part(tmp_path, "b", 10, [result(2, "docker-stopped", HEALED, 150.0)]),
        _part(tmp_path, "c", 9, [result(2, "docker-stopped", HEALED, 150.0)], drawn=6),
    ):
        with pytest.raises(SystemExit, match="drew another sequence"):
            chaos_main.main(
                ["--merge", str(a), "--merge", str(other), "--out", str(tmp_path / "w")]
            )
    with pytest.raises(SystemExit):
        chaos_main.parse(["--merge", str(tmp_path), "--out", str(tmp_path / "w")])
    with pytest.raises(SystemExit):
        chaos_main.parse(["--merge", str(a)])
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "name", ["worker-mtu-drift", "noop", "claimed-fabric-refused", "head-boot-fails"]
)
def test_changed_operations_parsed_from_real_pyinfra_output(name):
    """The text pyinfra 3.10 printed for a plan-test run (tests/plan/test_plan.py scenarios);
    the expected lists are what pyinfra's own state recorded for that run (every operation that
    executed commands on a host, the failed one last), not read from the text."""
    text = (OUTPUT / f"{name}.txt").read_text()
    recorded = json.loads((OUTPUT / f"{name}.json").read_text())
    parsed = pyinfra_output.parse(text)
    hosts = set(parsed.changed) | set(parsed.failed)
    assert hosts == set(recorded["changed_ops"])
    for host, ops in recorded["changed_ops"].items():
        assert parsed.changed.get(host, []) + parsed.failed.get(host, []) == ops, host
    if recorded["exit_code"] != 0:
        assert sum(len(ops) for ops in parsed.failed.values()) == 1
    else:
        assert parsed.failed == {}


def test_a_refused_run_changed_nothing_and_a_drift_run_names_its_operations():
    refused = pyinfra_output.parse((OUTPUT / "claimed-fabric-refused.txt").read_text())
    assert refused.changed == {} and refused.summary() == "nothing"
    assert refused.failed == {"@fake/spark-b": ["tasks/preflight.py | Refuse a host that fails "
                                                "preflight"]}  # fmt: skip
    drift = pyinfra_output.parse((OUTPUT / "worker-mtu-drift.txt").read_text())
    assert drift.changed["@fake/spark-b"][0].endswith(
        "Apply the fabric netplan to the fabric connection only"
    )
    assert "@fake/spark-b: Apply the fabric netplan to the fabric connection only, " in (
        drift.summary()
    )


def test_a_unit_restart_counts_only_where_the_fault_may_not_restart_it():
    before = {
        ("head", "sparkrig-head"): ("active", "a", "1"),
        ("head", "sparkrig-supervisor"): ("active", "b", "2"),
        ("worker", "sparkrig-agent"): ("active", "c", "3"),
        ("worker", "sparkrig-worker"): ("inactive", "", "0"),  # down before: its start is healing
    }
    after = {
        ("head", "sparkrig-head"): ("active", "a2", "10"),
        ("head", "sparkrig-supervisor"): ("active", "b", "2"),
        ("worker", "sparkrig-agent"): ("active", "c2", "11"),
        ("worker", "sparkrig-worker"): ("active", "d", "12"),
    }
    assert checks.restarted(before, after, PAIR, ("sparkrig-agent",), "worker") == []
    assert checks.restarted(before, after, PAIR, ("sparkrig-agent",), "head") == [
        "worker: sparkrig-agent restarted (the fault may not touch it)"
    ]
    assert checks.restarted(before, after, (), (), "head") == [
        "head: sparkrig-head restarted (the fault may not touch it)",
        "worker: sparkrig-agent restarted (the fault may not touch it)",
    ]
    gone = {k: v for k, v in after.items() if k != ("head", "sparkrig-supervisor")}
    assert checks.restarted(before, gone, ("sparkrig-head",), (), "head") == [
        "head: sparkrig-supervisor left gone (the fault may not touch it)",
        "worker: sparkrig-agent restarted (the fault may not touch it)",
    ]


def test_a_converged_dry_plans_nothing_and_a_bare_one_plans_the_owned_files():
    """``pyinfra --dry --json`` of the plan tests' pair, converged and bare (real output)."""
    converged = (OUTPUT / "dry-converged.json").read_text()
    assert any(op["hosts_with_conditional_change"] for op in json.loads(converged)["plan"])
    assert pyinfra_output.planned(converged) == []
    bare = pyinfra_output.planned((OUTPUT / "dry-bare.json").read_text())
    for host in ("@fake/spark-a", "@fake/spark-b"):
        assert f"{host}: Install the rank unit" in bare
        assert f"{host}: Persist the fabric address and MTU with netplan" in bare
    assert not any(p.endswith("Stop every rank for an ordered pair restart") for p in bare)


class _Node:
    """A guest whose fabric check answers ``said`` (what FABRIC prints on a rank)."""

    name, fabric_interface, fabric_address = "lab-worker1", "enp1s0f1np1", "10.200.0.2/24"
    container, ip = "sparkrig-rank1", "10.200.0.2"

    def __init__(self, said: dict[str, str]) -> None:
        self.said = said

    def sh(self, command: str, check: bool = True) -> str:
        assert "rdma dev show" in command and "SPARKRIG_ROCE_DEVICE_INDEX" in command
        return "".join(f"{k}={v}\n" for k, v in self.said.items())


def test_the_fabric_check_finds_a_rank_left_on_an_rdma_device_made_again(monkeypatch):
    monkeypatch.setattr(checks, "gid_index_for", lambda g, ip: 1)
    one = [("enp1s0f1np1", "rxe0", "10.200.0.2")]
    monkeypatch.setattr(checks, "fabric_functions", lambda g: one)  # the single-NIC lab
    whole = {"mtu": "9000", "swappiness": "0", "address": "1", "env": "1", "handed": "1",
             "container": "1", "device_handed": "4", "device_live": "4"}  # fmt: skip
    assert checks.fabric([_Node(whole)]) == []
    made_again = checks.fabric([_Node({**whole, "device_live": "5"})])
    assert made_again == [
        "lab-worker1: RDMA device index handed='4', now '5' (the device was made again under "
        "the rank)"
    ]
    assert checks.fabric([_Node({**whole, "device_handed": ""})])  # never handed: not whole


def test_pick_replays_some_faults_of_a_seed_with_their_drawn_parameters(capsys):
    assert chaos_main.main(["--plan", "--seed", "27", "--faults", "50", "--pick", "39,17"]) == 0
    out = capsys.readouterr().out
    assert "--pick 17,39" in out.splitlines()[0]
    picked = [line for line in out.splitlines() if line[:4].strip().rstrip(".").isdigit()]
    whole = {d.index: d.describe() for d in plan(27, 50)}
    assert picked == [whole[17], whole[39]]
    with pytest.raises(SystemExit):
        chaos_main.parse(["--faults", "3", "--pick", "4"])


BOTH = [
    ("enp1s0f1np1", "rocep1s0f1", "10.200.0.2"),
    ("enP2p1s0f1np1", "roceP2p1s0f1", "10.200.1.2"),
]


def test_on_both_functions_the_fabric_check_reads_every_function(monkeypatch):
    """The default pair lab: each function's MTU, address, handed GID and device index."""
    monkeypatch.setattr(checks, "gid_index_for", lambda g, ip: 1 if ip.endswith("0.2") else 3)
    monkeypatch.setattr(checks, "fabric_functions", lambda g: BOTH)
    whole = {"mtu_0": "9000", "mtu_1": "9000", "address_0": "1", "address_1": "1",
             "swappiness": "0", "env": "", "handed": "rocep1s0f1:1,roceP2p1s0f1:3",
             "devices": "rocep1s0f1:4,roceP2p1s0f1:5", "device_live_0": "4",
             "device_live_1": "5"}  # fmt: skip

    class Node(_Node):
        def sh(self, command: str, check: bool = True) -> str:
            assert "SPARKRIG_GID_INDEXES" in command and "enP2p1s0f1np1" in command
            return "".join(f"{k}={v}\n" for k, v in self.said.items())

    assert checks.fabric([Node(whole)]) == []
    assert checks.fabric([Node({**whole, "mtu_1": "1500", "device_live_1": "7"})]) == [
        "lab-worker1: enP2p1s0f1np1 MTU 1500, want 9000",
        "lab-worker1: roceP2p1s0f1 device index handed='5', now '7' (the device was made again "
        "under the rank)",
    ]
    moved = checks.fabric([Node({**whole, "handed": "rocep1s0f1:1,roceP2p1s0f1:2"})])
    assert moved == ["lab-worker1: roceP2p1s0f1 GID index handed='2', live 3"]
