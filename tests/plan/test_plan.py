"""Plans through the real CLI against strict @fake hosts: order, idempotence, --limit, bad input,
every injected failure stopping the run, and each pair-restart trigger with its negation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparkrig import hostpkg
from sparkrig.factlines import END
from sparkrig.paths import paths
from sparkrig.release import parse_record, record_path, wanted
from sparkrig.render import render
from sparkrig.serving import rank_unit_context, weights_id
from tests.plan import fakehosts
from tests.plan.harness import Run, run

HEAD, WORKER = "@fake/spark-a", "@fake/spark-b"
INVENTORY = "tests/plan/inventory_state.py"


def settings():  # read when a test runs, not at collection (loading the inventory patches gevent)
    return fakehosts.settings_of(INVENTORY)


IPS = {HEAD: "192.168.100.10", WORKER: "192.168.100.11"}
STOP = "Stop every rank for an ordered pair restart"
UP_FABRIC = "nmcli --wait 90 connection up netplan-enp1s0f1np1"


def apply(monkeypatch, *extra: str, inventory: str = INVENTORY) -> Run:
    return run(["-y", *extra, inventory, "deploy.py"], monkeypatch)


def converge_state(**overrides) -> None:
    """Make the fakes answer as ranks holding what the deploy renders for them."""
    for name, s in settings().items():
        short = name.split("/")[1]
        fakehosts.STATE[short] = fakehosts.converged(s, **overrides.get(short, {}))


# commands that change a node (facts excluded): none may reach a converged pair
ACTION = re.compile(
    r"^(systemctl (start|stop|restart|enable|daemon-reload)|netplan (apply|generate)|nmcli|"
    r"install -d|ip (link|addr) |"
    r"docker (run|rm|pull|build)|sysctl -p|install -m|chmod|chown|mkdir|\(systemctl is-active)|"
    r"sh -c 'umask 077"
)


def acting(r: Run, about: str = "") -> list[str]:
    """Every command of the run, on any host, that changes a host (``ACTION``) and names
    ``about``."""
    return [c for cmds in r.commands.values() for c in cmds if ACTION.search(c) and about in c]


def position(r: Run, name: str) -> int:
    matches = [i for i, op in enumerate(r.op_order) if op.endswith(name)]
    assert matches, f"no operation named {name!r} in {r.op_order}"
    return matches[0]


def test_first_run_starts_worker_then_head_gated_on_state(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    start_worker = position(r, "Start the worker rank")
    wait = position(r, "Wait until every worker's container runs")
    start_head = position(r, "Start the head rank")
    assert start_worker < wait < start_head
    assert fakehosts.start_of("sparkrig-worker") in r.commands[WORKER]
    head = r.commands[HEAD]
    waits = [i for i, c in enumerate(head) if "sparkhost pair wait" in c]
    assert waits and "192.168.100.11" in head[waits[0]]
    assert waits[0] < head.index(fakehosts.start_of("sparkrig-head"))
    assert not any("sparkrig-head" in c for c in r.commands[WORKER])


def test_first_run_uploads_exactly_the_rendered_files(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for name, s in settings().items():
        want = {path: data for path, (data, _) in fakehosts.owned_files(s).items()}
        got = dict(r.uploads[name])
        assert got.pop("/opt/sparkrig/image-build/context.tar")  # the image phase's build context
        record = parse_record(got.pop(record_path(s.knobs.config_dir)).decode())  # after the gates
        assert [r.identity for r in record] == [wanted(s).identity]
        assert got.keys() == want.keys()
        for path, data in want.items():
            assert got[path] == data, f"{name}: {path} differs from its render"


def test_second_run_with_converged_facts_changes_nothing(monkeypatch):
    converge_state()
    second = apply(monkeypatch)
    assert second.exit_code == 0, second.output
    assert second.changed_ops == {}, second.changed_ops
    assert second.uploads == {}
    assert not acting(second)


def test_limit_worker_plans_nothing_for_the_head(monkeypatch):
    converge_state()  # the worker's rank is down: it needs the head to start again
    down = ["Id=sparkrig-worker.service", "SubState=dead"]
    fakehosts.inject("spark-b", {fakehosts.unit_fact("sparkrig-worker", "SubState"): down})
    r = apply(monkeypatch, "--limit", "worker")
    assert r.exit_code == 0, r.output
    assert r.commands.get(HEAD, []) == []
    assert HEAD not in r.changed_ops
    # the worker never starts or stops its rank alone: it asks the head's supervisor
    assert fakehosts.start_of("sparkrig-worker") not in r.commands[WORKER]
    requests = [c for c in r.commands[WORKER] if "sparkhost pair request" in c]
    assert len(requests) == 1 and "--head 192.168.100.10" in requests[0]
    # (the state read names the host package's nccl_smoke.py: the smoke test is its container)
    assert not any("sparkrig-nccl-smoke" in c for c in r.commands[WORKER])


def test_limit_head_never_reaches_the_worker(monkeypatch):
    # the head judges the workers' drivers, images and weights only where they are in the run
    converge_state()
    r = apply(monkeypatch, "--limit", "head")
    assert r.commands.get(WORKER, []) == []


def test_limit_worker_with_a_drifted_fabric_asks_the_heads_supervisor_for_the_restart(monkeypatch):
    converge_state(**{"spark-b": {"mtu": 1500}})
    r = apply(monkeypatch, "--limit", "worker")
    assert r.exit_code == 0, r.output
    worker = r.commands[WORKER]
    assert UP_FABRIC in worker
    # never stopped or started alone (the head's stop-together and a restart would race it)
    assert not any(re.match(r"systemctl (stop|start) sparkrig-worker", c) for c in worker)
    requests = [i for i, c in enumerate(worker) if "sparkhost pair request" in c]
    assert len(requests) == 1 and worker.index(UP_FABRIC) < requests[0]
    assert r.commands.get(HEAD, []) == []
    assert "the NCCL smoke test and the serving gates are skipped" in r.output


def test_limit_worker_fails_and_says_what_to_run_when_the_head_cannot_restart(monkeypatch):
    converge_state(**{"spark-b": {"mtu": 1500}})
    said = "the pair is not restarted: run the deploy with the head in it"
    fakehosts.inject("spark-b", {fakehosts.PAIR_REQUEST: {"success": False, "stderr": said}})
    r = apply(monkeypatch, "--limit", "worker")
    assert r.exit_code != 0
    assert said in r.output


def test_firmware_reset_restores_mtu_and_gid_and_restarts_the_pair_in_order(monkeypatch):
    converge_state(**{"spark-b": {"gid_index": 5, "mtu": 1500}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    worker = r.commands[WORKER]
    assert UP_FABRIC in worker
    env = r.uploads[WORKER]["/etc/sparkrig/rank.env"].decode()
    assert "NCCL_IB_GID_INDEX=5\n" in env
    assert UP_FABRIC not in r.commands[HEAD]  # the head's fabric was right
    assert position(r, "Stop every rank for an ordered pair restart") < position(
        r, "Start the worker rank"
    )
    assert "systemctl stop sparkrig-head.service" in r.commands[HEAD]
    assert "systemctl stop sparkrig-worker.service" in r.commands[WORKER]
    assert position(r, "Start the worker rank") < position(r, "Start the head rank")


def test_an_administratively_down_fabric_link_is_brought_up_by_one_run(monkeypatch):
    """Issue 31: `ip link set down` (no IFF_UP, so no carrier) is sparkrig's to fix, not a
    cable refusal: the link comes up, the fabric is applied again, the pair restarts in order."""
    converge_state(**{"spark-b": {"admin_up": False}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    worker = r.commands[WORKER]
    up = worker.index("ip link set dev enp1s0f1np1 up")
    assert "check the QSFP cable" in worker[up + 1]  # then a bounded wait for carrier
    assert "is administratively down" in r.output
    assert worker.index(UP_FABRIC) > up
    assert not any(c.startswith("ip link set") for c in r.commands[HEAD])
    assert position(r, "Stop every rank for an ordered pair restart") < position(
        r, "Start the worker rank"
    )
    assert position(r, "Start the worker rank") < position(r, "Start the head rank")


def test_a_rank_down_beside_a_serving_head_restarts_the_pair_in_order(monkeypatch):
    """Issue 31: a worker whose rank stopped while the head's engine ran is never started alone
    (the head's engine would refuse it): the head is marked and stopped first, then the pair
    starts worker first."""
    converge_state(**{"spark-b": {"rank_down": True}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    head = r.commands[HEAD]
    marks = [c for c in head if "/run/sparkrig/pair-down" in c]
    assert marks and "@fake/spark-b down while sparkrig-head ran" in marks[0]
    assert head.index(marks[0]) < head.index("systemctl stop sparkrig-head.service")
    assert position(r, "Stop every rank for an ordered pair restart") < position(
        r, "Start the worker rank"
    )
    assert fakehosts.start_of("sparkrig-worker") in r.commands[WORKER]
    assert position(r, "Start the worker rank") < position(r, "Start the head rank")
    assert fakehosts.start_of("sparkrig-head") in head


PREFLIGHT = "Refuse a host that fails preflight"


def ops_after(r: Run, op: str) -> list[str]:
    """Operations after ``op`` that sent a command to any host (nothing may run after a failure)."""
    limit = position(r, op)
    return sorted({o for ops in r.changed_ops.values() for o in ops if r.op_order.index(o) > limit})


@pytest.mark.parametrize(
    ("short", "report", "message"),
    [
        ("spark-b", {"docker": ""}, "docker is not installed"),
        (
            "spark-b",
            {"disk_free": 40 * 1024**3},
            "40.0 GiB free under /var/lib/sparkrig/models, need 64.0 GiB",
        ),
        (
            "spark-b",
            {"carrier": 0},
            "fabric interface enp1s0f1np1 is up but has no carrier (flags IFF_UP, carrier 0, "
            "operstate down): check the QSFP cable",
        ),
        (
            "spark-b",
            {"netdevs": "enP7s7:up,enp1s0f0np0:up,enp1s0f1np1x:down,lo:unknown"},
            "fabric interface enp1s0f1np1 does not exist (fabric_interface); the netdevs here: "
            "enP7s7 (up), enp1s0f0np0 (up), enp1s0f1np1x (down), lo (unknown); set it in the "
            "inventory to the cabled ConnectX-7 netdev (`ibdev2netdev` on the host shows which "
            "is Up)",
        ),
        (
            "spark-b",
            {"min_free_kbytes": 1048576},
            "vm.min_free_kbytes differs: 67584 here, 1048576 on @fake/spark-b",
        ),
    ],
    ids=["no-docker", "disk", "carrier", "no-fabric-nic", "min-free-kbytes"],
)
def test_preflight_refusal_stops_everyone_before_any_change(monkeypatch, short, report, message):
    fakehosts.inject(short, {fakehosts.NODE: fakehosts.node_report(**report)})
    refused_before_any_change(apply(monkeypatch), message)


def refused_before_any_change(r: Run, message: str) -> None:
    """Preflight refused one host with ``message``, and nothing changed on any host."""
    assert r.exit_code != 0
    assert message in r.output
    refused = [c for cmds in r.commands.values() for c in cmds if c.endswith(">&2; exit 1")]
    assert len(refused) == 1 and message in refused[0]
    for name in (HEAD, WORKER):
        assert r.uploads.get(name, {}) == {}, f"{name} was changed"
        assert r.changed_ops.get(name, []) in ([], [f"tasks/preflight.py | {PREFLIGHT}"])
    assert ops_after(r, PREFLIGHT) == []


@pytest.mark.parametrize(
    ("lock", "message"),
    [
        (None, "no lockfile {dir}/LibertAIDAI--GLM-5.3-Flash-NVFP4.lock.json"),
        ("0" * 40, "is for LibertAIDAI/GLM-5.3-Flash-NVFP4@" + "0" * 40 + ", not"),
    ],
    ids=["missing", "other-commit"],
)
def test_a_missing_or_stale_lockfile_stops_the_run_before_any_host_command(
    monkeypatch, tmp_path, lock, message
):
    if lock is not None:
        name = "LibertAIDAI--GLM-5.3-Flash-NVFP4.lock.json"
        data = json.loads(open(f"tests/plan/locks/{name}").read())
        (tmp_path / name).write_text(json.dumps({**data, "commit": lock}))
    r = apply(monkeypatch, "--data", f"lockfile_dir={tmp_path}")
    assert r.exit_code != 0
    assert message.format(dir=tmp_path) in str(r.exception) + r.output
    assert "python3 -m sparkrig.lockfile refresh" in str(r.exception) + r.output
    assert all(cmds == [] for cmds in r.commands.values()), r.commands


FAILURES = {
    "netplan": (
        WORKER, fakehosts.NETPLAN_GENERATE, "Invalid YAML at /etc/netplan/60-sparkrig-fabric.yaml",
        "Apply the fabric netplan to the fabric connection only",
    ),
    "df-ping": (
        WORKER, fakehosts.PING, "ping: local error: message too long, mtu=1500",
        "Prove the fabric MTU end to end with do-not-fragment pings",
    ),
    "fetch": (
        HEAD, fakehosts.FETCH, "sparkrig-fetch: model-00001-of-00002.safetensors: sha256 mismatch",
        "Fetch and verify the weights on the head",
    ),
    "worker-copy": (
        WORKER, fakehosts.FETCH, "sparkrig-fetch: http://192.168.100.10:29700: connection refused",
        "Copy and verify the weights from the head over the fabric",
    ),
    "nccl-head": (
        HEAD, fakehosts.SMOKE_HEAD, "nccl_smoke: all-reduce used NET/Socket, not NET/IB",
        "Run the NCCL smoke test on the head",
    ),
    "nccl-worker": (
        WORKER, fakehosts.SMOKE_CHECK, "nccl_smoke: rank 1: all-reduce used NET/Socket",
        "Check the NCCL smoke test on the workers",
    ),
    "beacon-wait": (
        HEAD, fakehosts.PAIR_WAIT, "sparkrig-pair: timed out waiting for 192.168.100.11",
        "Wait until every worker's container runs",
    ),
    "boot": (
        HEAD, fakehosts.BOOT_WAIT, "container sparkrig-rank0 exited during boot",
        "Wait for the head's API to finish booting",
    ),
}  # fmt: skip


@pytest.mark.parametrize("what", sorted(FAILURES))
def test_a_failing_step_fails_the_deploy_and_nothing_after_it_runs(monkeypatch, what):
    name, matcher, stderr, op = FAILURES[what]
    fakehosts.inject(name.split("/")[1], {matcher: {"success": False, "stderr": stderr}})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert stderr in r.output
    assert any(matcher.search(c) for c in r.commands[name])
    assert ops_after(r, op) == [], f"ran after {op!r} failed"
    if position(r, op) < position(r, "Start the head rank"):
        assert fakehosts.start_of("sparkrig-head") not in r.commands[HEAD]


def test_a_failing_gate_fails_the_deploy_and_nothing_is_pruned(monkeypatch):
    converge_state()
    old = "sparkrig/vllm-glm53:old-" + "cd" * 12
    bad_gate = json.dumps({"gate": "math", "ok": False, "detail": "answered 392", "ms": 9})
    fakehosts.inject(
        "spark-a",
        {
            fakehosts.GATES: [*fakehosts.HEALTHY_GATES[:2], bad_gate, *fakehosts.HEALTHY_GATES[3:]],
            fakehosts.IMAGE_FACT: fakehosts.image_state(fakehosts.IMAGE, extra_tags=(old,)),
        },
    )
    r = apply(monkeypatch)
    assert r.exit_code != 0
    failed = [c for c in r.commands[HEAD] if c.endswith(">&2; exit 1")]
    assert len(failed) == 1
    assert (
        "serving gates failed: health ok (ok); models ok (ok); math FAILED (answered 392); tool "
        "ok (ok); locked ok (ok); "
        "read why on @fake/spark-a: `sudo journalctl -u sparkrig-head -n 200` (the serving unit) "
        "and `sudo docker logs --tail 200 sparkrig-rank0` (vLLM)"
    ) in failed[0]
    assert not any("docker image rm" in c for cmds in r.commands.values() for c in cmds)
    # the same node with passing gates prunes the old tag, after the gates
    fakehosts.STATE["spark-a"].pop(fakehosts.GATES)
    ok = apply(monkeypatch)
    assert ok.exit_code == 0, ok.output
    assert any(c.startswith(f"docker image rm {old} ") for c in ok.commands[HEAD])
    assert position(ok, "Pass the five serving gates") < position(
        ok, "Prune old sparkrig images once the pair is healthy"
    )


@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        ("tests/plan/bad/no_head.py", "group 'head' must hold exactly one host"),
        ("tests/plan/bad/two_heads.py", "group 'head' must hold exactly one host"),
        ("tests/plan/bad/same_ip.py", "fabric_address: 192.168.100.10 is already used"),
        ("tests/plan/bad/no_address.py", "spark-b: fabric_address: missing"),
        (
            "tests/plan/bad/misspelled_knob.py",
            "spark-b: profil: unknown key; did you mean 'profile'",
        ),
    ],
)
def test_bad_inventory_sends_no_command_to_any_host(monkeypatch, inventory, message):
    r = run(["-y", inventory, "deploy.py"], monkeypatch)
    assert r.exit_code != 0
    assert message in str(r.exception) + r.output
    assert all(cmds == [] for cmds in r.commands.values()), r.commands


def test_a_misspelled_knob_from_data_or_group_data_is_refused_per_host_before_any_command(
    monkeypatch, tmp_path
):
    (tmp_path / "worker.py").write_text("pair_grace = 300\n")
    args = ["--data", "profil=guard", "--group-data", str(tmp_path), "-y", INVENTORY, "deploy.py"]
    r = run(args, monkeypatch)
    text = str(r.exception) + r.output
    assert r.exit_code != 0
    # --data reaches every host: said once (issue 49); group_data of the worker names it
    assert text.count("profil: unknown key; did you mean 'profile'?") == 1, text
    assert "every host: profil: unknown key; did you mean 'profile'?" in text
    assert "spark-b: pair_grace: unknown key; did you mean 'pair_grace_s'?" in text
    assert "spark-a: pair_grace" not in text  # group data of the workers only
    assert all(cmds == [] for cmds in r.commands.values()), r.commands


def test_a_rank_start_its_gate_refuses_fails_showing_the_refusal_and_the_knob(monkeypatch):
    """The start gate (sparkhost prep) says why in the journal; the deploy shows those lines
    under the failed start, where systemctl alone says only "see journalctl"."""
    from sparkhost.prep import memory_advice

    k = settings()[WORKER].knobs
    advice = memory_advice(k.memfree_min_gib, k.memfree_margin_gib)
    journal = [
        "sparkrig-prep: MemFree 80.2 GiB < 101.9 GiB after 120 s of dropping caches; top ...",
        f"sparkrig-prep: refusing to start: {advice}",
    ]
    start = fakehosts.start_of("sparkrig-worker")
    fakehosts.inject("spark-b", {start: {"success": False, "stderr": journal}})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert start in r.commands[WORKER]
    assert start.endswith(
        "|| { journalctl -u sparkrig-worker.service -n 25 -o cat --no-pager >&2; exit 1; }"
    )
    for line in journal:
        assert line in r.output
    assert "memfree_min_gib" in r.output and "group_data/all.py" in r.output
    assert fakehosts.start_of("sparkrig-head") not in r.commands[HEAD]


def test_weights_come_over_both_uplinks_to_the_head_then_over_the_fabric(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    fetch = [c for c in r.commands[HEAD] if "systemd-run" in c and " fetch " in c]
    assert fetch and "--uplink=enP7s7" in fetch[0] and "--uplink=wlP9s9" in fetch[0]
    assert "--endpoint https://huggingface.co" in fetch[0]
    copy = [c for c in r.commands[WORKER] if "systemd-run" in c and " fetch " in c]
    assert copy and "--base-url http://192.168.100.10:29700/model" in copy[0]
    assert "--uplink=enp1s0f1np1" in copy[0] and "huggingface.co" not in copy[0]
    order = [
        position(r, "Fetch and verify the weights on the head"),
        position(r, "Serve the verified weights to the workers over the fabric"),
        position(r, "Copy and verify the weights from the head over the fabric"),
        position(r, "Stop serving the weights"),
    ]
    assert order == sorted(order)


def test_the_fetch_and_the_boot_print_their_progress_at_ordinary_verbosity(monkeypatch):
    r = apply(monkeypatch)  # no -v: pyinfra prints no other command's output
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        follows = [c for c in r.shown.get(name, []) if " follow " in c]
        assert follows and "--print-every 60" in follows[0], r.shown.get(name)
    assert any(" wait " in c for c in r.shown[HEAD])  # the boot's stages, the peers' wait
    # and the release's soak, a line a minute for soak_minutes
    assert any(" soak " in c for c in r.shown[HEAD])
    assert all(any(f" {job} " in c for job in ("follow", "wait", "soak")) for c in r.shown[HEAD])


def test_nccl_smoke_test_runs_workers_first_before_a_pair_start_and_not_when_converged(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    steps = [
        "Launch the NCCL smoke test on the workers",
        "Run the NCCL smoke test on the head",
        "Check the NCCL smoke test on the workers",
        "Start the worker rank",
    ]
    assert [position(r, s) for s in steps] == sorted(position(r, s) for s in steps)
    launch = [
        c for c in r.commands[WORKER] if "docker run --detach --name sparkrig-nccl-smoke" in c
    ]
    assert launch and "RANK=1" in launch[0] and "MASTER_ADDR=192.168.100.10" in launch[0]
    assert "--device /dev/infiniband:/dev/infiniband" in launch[0]
    head = [c for c in r.commands[HEAD] if "docker run --rm --name sparkrig-nccl-smoke" in c]
    assert head and "RANK=0" in head[0]
    # the image's python3 runs the host package, mounted read-only at its own path
    package = "/opt/sparkrig/lib/sparkhost"
    assert f"--volume {package}:{package}:ro" in head[0]
    assert re.search(rf"--entrypoint python3 \S+ {package} nccl-smoke --timeout 300 --bytes "
                     r"268435456 --warmup 5 --iters 20 --min-busbw-gbs 8$", head[0])  # fmt: skip
    converge_state()
    again = apply(monkeypatch)
    assert not any("sparkrig-nccl-smoke" in c for cmds in again.commands.values() for c in cmds)


def hold_an_older_revision() -> None:
    """Both hosts hold an older lockfile, all its files verified."""
    stale = json.dumps({"ok": True, "commit": "0" * 40, "total_files": 2, "verified": 2,
                        "files_to_fetch": 0, "bytes_to_fetch": 0})  # fmt: skip
    for short in ("spark-a", "spark-b"):
        fakehosts.inject(short, {fakehosts.WEIGHTS_STATE: stale})


def test_a_host_holding_another_revision_is_not_taken_as_verified(monkeypatch):
    converge_state()
    hold_an_older_revision()
    r = run(["--dry", "tests/plan/inventory_state.py", "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert "lockfile caca4e6a4ebb not judged on the host yet: up to 2 files" in r.output
    assert "Fetch and verify the weights on the head" in " ".join(r.changed_ops[HEAD])


def assert_ordered_pair_restart(r: Run) -> None:
    """Every rank stopped in one operation (the watchdog paused before it), the workers' NCCL
    smoke test and start, their beacons awaited, then the head started."""
    assert r.exit_code == 0, r.output
    assert "systemctl stop sparkrig-head.service" in r.commands[HEAD]
    assert "systemctl stop sparkrig-worker.service" in r.commands[WORKER]
    assert STOP in " ".join(r.changed_ops[HEAD]) and STOP in " ".join(r.changed_ops[WORKER])
    steps = [
        STOP,
        "Launch the NCCL smoke test on the workers",
        "Run the NCCL smoke test on the head",
        "Start the worker rank",
        "Wait until every worker's container runs",
        "Start the head rank",
    ]
    assert [position(r, s) for s in steps] == sorted(position(r, s) for s in steps)
    assert position(r, "Pause the watchdog during an ordered pair restart") < position(r, STOP)
    worker, head = r.commands[WORKER], r.commands[HEAD]
    assert worker.index("systemctl stop sparkrig-worker.service") < worker.index(
        fakehosts.start_of("sparkrig-worker")
    )
    assert head.index("systemctl stop sparkrig-head.service") < head.index(
        fakehosts.start_of("sparkrig-head")
    )


def assert_no_restart(r: Run) -> None:
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        assert not [
            c
            for c in r.commands[name]
            if re.match(r"systemctl (stop|start) sparkrig-(head|worker)", c)
        ]
        assert not any("sparkrig-nccl-smoke" in c for c in r.commands[name])


def test_a_fabric_address_the_plan_does_not_give_is_removed_and_named(monkeypatch):
    """Issue 47: an address of the fabric subnet (.222) added before the plan's on the worker's
    fabric NIC (the kernel sources the rank's traffic from it; the head's firewall drops it as
    not a peer) is deleted by name, the fabric re-applied and the pair restarted in order; an
    address outside the fabric's subnet (link-local, another network) stays."""
    converge_state(**{"spark-b": {"ipv4_before": ("192.168.100.222/24", "169.254.3.1/16")}})
    r = apply(monkeypatch)
    worker = r.commands[WORKER]
    removed = [c for c in worker if "ip -4 addr del" in c]
    assert len(removed) == 1 and "192.168.100.222/24" in removed[0], worker
    assert "169.254.3.1" not in removed[0]
    assert "removing 192.168.100.222/24" in r.output
    assert worker.index(removed[0]) < worker.index(UP_FABRIC)
    assert not any("ip -4 addr del" in c for c in r.commands[HEAD])
    assert_ordered_pair_restart(r)


def test_an_address_outside_the_fabric_subnet_changes_nothing(monkeypatch):
    converge_state(**{"spark-b": {"ipv4_before": ("169.254.3.1/16", "192.0.2.7/24")}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert not [c for c in r.commands[WORKER] if ACTION.match(c)]


def test_an_mtu_reset_alone_restarts_the_pair(monkeypatch):
    converge_state(**{"spark-b": {"mtu": 1500}})
    r = apply(monkeypatch)
    assert UP_FABRIC in r.commands[WORKER]
    assert "/etc/sparkrig/rank.env" not in r.uploads.get(WORKER, {})  # the GID did not move
    assert_ordered_pair_restart(r)


def test_a_gid_index_that_moved_alone_is_recorded_and_restarts_nothing(monkeypatch):
    # A reboot renumbered the worker's GID table: its rank came back with the live index 5
    # (sparkhost prep), its env file still says 3.
    converge_state(**{"spark-b": {"gid_index": 5}})
    r = apply(monkeypatch)
    assert r.changed_ops == {
        WORKER: ["tasks/fabric.py | Record a RoCE GID index that moved alone (no restart)"]
    }
    assert "NCCL_IB_GID_INDEX=5\n" in r.uploads[WORKER]["/etc/sparkrig/rank.env"].decode()
    assert_no_restart(r)


@pytest.mark.parametrize(
    ("short", "overrides", "env_index"),
    [
        # the worker's table renumbered while its rank ran (its RoCE device re-created with
        # other GIDs first): its container still has the index 3 it was handed at its start
        ("spark-b", {"gid_index": 5, "handed_gid_index": 3}, "5"),
        # a firmware reset re-created the head's device: the same GID index, a new kernel index
        ("spark-a", {"device_index": 4, "live_device_index": 5}, None),
    ],
    ids=["gid-index-moved", "device-made-again"],
)
def test_a_roce_device_that_changed_under_a_running_rank_restarts_the_pair(
    monkeypatch, short, overrides, env_index
):
    converge_state(**{short: overrides})
    r = apply(monkeypatch)
    changed, other = (HEAD, WORKER) if short == "spark-a" else (WORKER, HEAD)
    assert r.exit_code == 0, r.output
    assert "rm -f /run/sparkrig/gid.env" in r.commands[changed]
    assert "rm -f /run/sparkrig/gid.env" not in r.commands[other]
    env = r.uploads.get(changed, {}).get("/etc/sparkrig/rank.env", b"").decode()
    assert (f"NCCL_IB_GID_INDEX={env_index}\n" in env) if env_index else env == ""
    assert_ordered_pair_restart(r)


def test_an_ordered_restart_stops_a_rank_still_in_its_start_gate(monkeypatch):
    # The supervisor had begun starting the head (its start gate wakes the workers' agents)
    # when the deploy decided a restart: a rank that is starting is stopped like a running one,
    # or its start gate starts the worker again under the deploy's stop.
    converge_state(**{"spark-b": {"mtu": 1500}})
    starting = ["Id=sparkrig-head.service", "SubState=start-pre"]
    fakehosts.inject("spark-a", {fakehosts.unit_fact("sparkrig-head", "SubState"): starting})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert_ordered_pair_restart(r)


def test_a_frozen_rank_container_is_thawed_and_the_pair_restarts(monkeypatch):
    converge_state(**{"spark-b": {"container": "paused"}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert r.commands[WORKER].index("docker unpause sparkrig-rank1") < r.commands[WORKER].index(
        "systemctl stop sparkrig-worker.service"
    )
    assert not [c for c in r.commands[HEAD] if "docker unpause" in c]
    assert_ordered_pair_restart(r)


def test_a_fabric_nic_without_its_roce_device_gets_it_back_before_its_env_file(monkeypatch):
    converge_state()
    fakehosts.inject("spark-b", {fakehosts.GIDS: [END]})  # the device deleted: no GID at all
    r = apply(monkeypatch)
    # the fakes' table does not come back, so the env file's GID read fails the worker after
    # the restore ran: the restore, its wait, and no start of anything
    restore = [c for c in r.commands[WORKER] if c.startswith("modprobe mlx5_ib")]
    assert restore == ["modprobe mlx5_ib"], r.commands[WORKER]
    waits = [c for c in r.commands[WORKER] if "gid_attrs/ndevs" in c and c.startswith("timeout")]
    assert len(waits) == 1 and "enp1s0f1np1" in waits[0]
    assert not [c for c in r.commands[HEAD] if c.startswith("modprobe")]


def test_a_new_profile_restarts_the_pair_and_the_same_profile_restarts_nothing(monkeypatch):
    converge_state()  # rendered with group_data's profile, "shared"
    same = apply(monkeypatch, "--data", "profile=shared")
    assert same.changed_ops == {}, same.changed_ops
    assert_no_restart(same)
    other = apply(monkeypatch, "--data", "profile=long")
    assert_ordered_pair_restart(other)
    for name in (HEAD, WORKER):
        unit = other.uploads[name][paths(settings()[name]).rank_unit].decode()
        assert "--max-num-seqs 2" in unit


def older(name: str, path: str, text: str) -> dict[str, dict]:
    """Overrides for converge_state: ``name`` holds an older ``path``."""
    return {name.split("/")[1]: {"files": {path: (text.encode(), "644")}}}


def rank_unit_with_image(name: str, image: str) -> str:
    s = settings()[name]
    return render("sparkrig-rank.service.j2", **rank_unit_context(s, image, weights_id(s)))


@pytest.mark.parametrize(
    "trigger",
    ["patch-tag", "rank-unit", "pair-unit", "env-file"],
)
def test_each_changed_file_restarts_the_whole_pair(monkeypatch, trigger):
    p = paths(settings()[WORKER])
    if trigger == "patch-tag":  # the worker still runs the image of the previous patch set
        old = rank_unit_with_image(WORKER, "sparkrig/vllm-glm53:" + "ee" * 12)
        converge_state(**older(WORKER, p.rank_unit, old))
    elif trigger == "rank-unit":
        converge_state(**older(WORKER, p.rank_unit, "[Unit]\nDescription=older\n"))
    elif trigger == "pair-unit":
        converge_state(**older(HEAD, p.pair_unit, "[Unit]\nDescription=older\n"))
    else:
        converge_state(**older(WORKER, p.env_file, "NCCL_IB_HCA=rocep1s0f1\n"))
    r = apply(monkeypatch)
    assert_ordered_pair_restart(r)
    assert len(r.uploads) == 1  # only the one stale file was rewritten


def test_a_new_weights_revision_restarts_the_pair(monkeypatch):
    converge_state()
    hold_an_older_revision()
    r = apply(monkeypatch)
    assert any(fakehosts.FETCH.search(c) for c in r.commands[HEAD])
    assert any(fakehosts.FETCH.search(c) for c in r.commands[WORKER])
    assert_ordered_pair_restart(r)
    assert position(r, "Copy and verify the weights from the head over the fabric") < position(
        r, STOP
    )


def test_weights_a_worker_had_to_copy_again_restart_the_pair(monkeypatch):
    converge_state()
    missing = json.dumps({"ok": True, "commit": fakehosts.COMMIT, "total_files": 2,
                          "verified": 1, "missing": 1, "files_to_fetch": 1,
                          "bytes_to_fetch": 4096})  # fmt: skip
    fakehosts.inject("spark-b", {fakehosts.WEIGHTS_STATE: missing})
    r = apply(monkeypatch)
    assert not any(fakehosts.FETCH.search(c) for c in r.commands[HEAD])  # the head has them
    assert any(fakehosts.FETCH.search(c) for c in r.commands[WORKER])
    assert_ordered_pair_restart(r)


def test_a_command_no_fake_declares_fails_the_test(monkeypatch):
    with pytest.raises(pytest.fail.Exception, match="no fake host declares") as err:
        run(["-y", INVENTORY, "exec", "--", "rm -rf /srv/elsewhere"], monkeypatch)
    assert "@fake/spark-a: rm -rf /srv/elsewhere" in str(err.value)


def test_four_nodes_start_every_worker_before_the_head_waits_for_them(monkeypatch):
    # four, not three: vLLM stacks refuse three ranks (64 heads; tests/plan/test_rings.py)
    r = apply(monkeypatch, inventory="tests/plan/inventory_4nodes.py")
    assert r.exit_code == 0, r.output
    workers = ("@fake/spark-b", "@fake/spark-c", "@fake/spark-d")
    for rank, name in enumerate(workers, start=1):
        cmds = r.commands[name]
        assert fakehosts.start_of("sparkrig-worker") in cmds
        launch = [c for c in cmds if fakehosts.SMOKE_WORKER.search(c)]
        assert launch and f"RANK={rank}" in launch[0] and "WORLD_SIZE=4" in launch[0]
        assert any(c.startswith("ping -M do") and "192.168.100.10" in c for c in cmds)
    head = r.commands[HEAD]
    wait = [c for c in head if fakehosts.PAIR_WAIT.search(c)]
    assert wait and "--peers 192.168.100.11,192.168.100.12,192.168.100.13 " in wait[0]
    ping = [c for c in head if fakehosts.PING.search(c)]
    assert ping and all(f"192.168.100.1{i}" in ping[0] for i in (1, 2, 3))
    steps = ["Start the worker rank", "Wait until every worker's container runs"]
    assert position(r, steps[0]) < position(r, steps[1]) < position(r, "Start the head rank")


def test_profile_single_fetches_the_drafter_too_and_copies_it_to_the_workers(monkeypatch):
    r = apply(monkeypatch, "--data", "profile=single", "--data", "drafter_license_accepted=True")
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        fetched = [c for c in r.commands[name] if fakehosts.FETCH.search(c)]
        assert len(fetched) == 2, fetched
        assert "--dest /var/lib/sparkrig/models/drafter" in fetched[1]
        assert "/etc/sparkrig/drafter.lock.json" in r.uploads[name]
    drafter = [c for c in r.commands[WORKER] if "sparkrig-fetch-drafter" in c]
    assert drafter and "--base-url http://192.168.100.10:29700/drafter" in drafter[0]
    unit = r.uploads[HEAD]["/etc/systemd/system/sparkrig-head.service"].decode()
    assert "/var/lib/sparkrig/models/drafter" in unit


def test_secrets_never_reach_the_output_nor_a_command_line(monkeypatch, tmp_path):
    hub_token = "hf_" + "s3cret" * 6
    monkeypatch.setenv("HF_TOKEN", hub_token)
    pair_token = open("tests/plan/pair-token").read().strip()
    api_key = open("tests/plan/api-key").read().strip()
    gated = gated_locks(tmp_path)  # the head gets the token only for a gated repo
    for args in (["--dry", "--diff"], ["-y", "--diff"]):
        r = run([*args, *gated, "-v", INVENTORY, "deploy.py"], monkeypatch)
        assert r.exit_code == 0, r.output
        for secret in (hub_token, pair_token, api_key):
            assert secret not in r.output
            assert not [c for cmds in r.commands.values() for c in cmds if secret in c]
    assert r.uploads[HEAD]["/etc/sparkrig/hf-token"] == (hub_token + "\n").encode()
    assert "/etc/sparkrig/hf-token" not in r.uploads[WORKER]  # the head alone fetches
    assert r.uploads[WORKER]["/etc/sparkrig/pair-token"].decode().strip() == pair_token


def no_hub_token(monkeypatch, login_file: str) -> None:
    """The control machine as huggingface_hub sees it: no token in the environment, and
    ``login_file`` where `hf auth login` keeps it (absent: never logged in)."""
    import huggingface_hub.constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", login_file)


def test_the_login_files_token_reaches_the_head_when_hf_token_is_unset(monkeypatch, tmp_path):
    login = tmp_path / "token"
    login.write_text("hf_" + "login" * 6 + "\n")
    no_hub_token(monkeypatch, str(login))
    r = apply(monkeypatch, *gated_locks(tmp_path))
    assert r.exit_code == 0, r.output
    assert r.uploads[HEAD]["/etc/sparkrig/hf-token"] == ("hf_" + "login" * 6 + "\n").encode()


def gated_locks(tmp_path) -> list[str]:
    """--data pointing the deploy at the test lockfiles with the model marked gated on the Hub."""
    for lock in Path("tests/plan/locks").glob("*.lock.json"):
        data = json.loads(lock.read_text())
        gated = "manual" if data["repo"] == "LibertAIDAI/GLM-5.3-Flash-NVFP4" else False
        (tmp_path / lock.name).write_text(json.dumps({**data, "gated": gated}))
    return ["--data", f"lockfile_dir={tmp_path}"]


def test_a_gated_repo_without_a_hub_token_is_refused_before_any_command(monkeypatch, tmp_path):
    gated_locks(tmp_path)
    no_hub_token(monkeypatch, str(tmp_path / "never-logged-in"))
    r = run(["--data", f"lockfile_dir={tmp_path}", "-y", INVENTORY, "deploy.py"], monkeypatch)
    text = str(r.exception) + r.output
    assert r.exit_code != 0
    assert "LibertAIDAI/GLM-5.3-Flash-NVFP4 is gated on the Hub (manual approval)" in text
    assert "hf auth login" in text and "HF_TOKEN" in text
    assert all(cmds == [] for cmds in r.commands.values()), r.commands
    monkeypatch.setenv("HF_TOKEN", "hf_" + "t" * 30)  # with a token the same lockfiles deploy
    ok = run(["--data", f"lockfile_dir={tmp_path}", "-y", INVENTORY, "deploy.py"], monkeypatch)
    assert ok.exit_code == 0, ok.output


def test_a_gated_repos_token_never_goes_to_a_plain_http_hub_endpoint(monkeypatch, tmp_path):
    gated_locks(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_" + "t" * 30)
    args = ["--data", f"lockfile_dir={tmp_path}", "--data", "hub_endpoint=http://mirror.lan:8080"]
    r = run([*args, "-y", INVENTORY, "deploy.py"], monkeypatch)
    text = str(r.exception) + r.output
    assert r.exit_code != 0
    assert "sends the Hub token to hub_endpoint http://mirror.lan:8080" in text, text
    assert all(cmds == [] for cmds in r.commands.values()), r.commands


API_KEY, API_ENV = "/etc/sparkrig/api-key", "/etc/sparkrig/api-key.env"
HEAD_UNIT = "/etc/systemd/system/sparkrig-head.service"


def test_the_api_key_reaches_vllm_only_through_a_0600_env_file_on_the_head(monkeypatch):
    key = open("tests/plan/api-key").read().strip()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    head = r.commands[HEAD]
    assert r.uploads[HEAD][API_ENV] == f"VLLM_API_KEY={key}\n".encode()
    assert r.uploads[HEAD][API_KEY] == f"{key}\n".encode()
    for dest in (API_KEY, API_ENV):  # written through stdin under umask 077 (sparkrig/secretio)
        assert [c for c, _ in r.stdin[HEAD] if f" {dest} " in c and "umask 077" in c]
    unit = r.uploads[HEAD][HEAD_UNIT].decode()
    assert f"--env-file {API_ENV}" in unit and key not in unit
    assert not [c for cmds in r.commands.values() for c in cmds if key in c]  # no argv holds it
    gates = [c for c in head if fakehosts.GATES.search(c)]
    assert gates and all(f"--api-key-file {API_KEY}" in c for c in gates)
    # workers serve no API: no key, no env file
    assert not {API_KEY, API_ENV} & set(r.uploads[WORKER])
    assert API_ENV not in r.uploads[WORKER]["/etc/systemd/system/sparkrig-worker.service"].decode()


def test_the_api_key_never_appears_in_dry_diff_output(monkeypatch):
    key = open("tests/plan/api-key").read().strip()
    r = run(["--dry", "--diff", "-v", INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert key not in r.output
    assert f"Will write {API_ENV} (secret: content not shown)" in r.output
    assert not [c for cmds in r.commands.values() for c in cmds if key in c]


def test_api_auth_off_removes_the_key_the_env_file_and_the_header(monkeypatch):
    converge_state()  # the head holds both key files
    r = apply(monkeypatch, "--data", "api_auth=False")
    assert r.exit_code == 0, r.output
    head = r.commands[HEAD]
    assert f"rm -f {API_KEY}" in head and f"rm -f {API_ENV}" in head
    assert not {API_KEY, API_ENV} & set(r.uploads[HEAD])
    unit = r.uploads[HEAD][HEAD_UNIT].decode()
    assert "api-key" not in unit  # no --env-file: vLLM gets no VLLM_API_KEY
    gates = [c for c in head if fakehosts.GATES.search(c)]
    assert gates and not [c for c in gates if "--api-key-file" in c]
    assert "systemctl stop sparkrig-head.service" in head  # the unit changed: ordered restart


CX7 = "/etc/netplan/40-cx7.yaml"
NM_PROFILE = "/etc/NetworkManager/system-connections/cx7-port1.nmconnection"


def claimed_worker(*claims: str) -> None:
    """The worker's node report names other configurations of its fabric NIC."""
    fakehosts.inject("spark-b", {fakehosts.NODE: fakehosts.node_report(claims=claims)})


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (
            f"netplan_claim={CX7}",
            f"fabric interface enp1s0f1np1 is also configured by the netplan file {CX7}",
        ),
        (
            f"nm_claim={NM_PROFILE}|cx7-port1",
            "fabric interface enp1s0f1np1 is also claimed by the NetworkManager profile "
            f"'cx7-port1' ({NM_PROFILE})",
        ),
    ],
)
def test_a_fabric_nic_claimed_by_someone_else_stops_the_run_at_preflight(
    monkeypatch, claim, message
):
    claimed_worker(claim)
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert message in r.output
    assert "set fabric_takeover = True" in r.output
    for name in (HEAD, WORKER):
        assert r.uploads.get(name, {}) == {}, f"{name} was changed"
        assert not any("mv -f" in c or "nmcli" in c for c in r.commands.get(name, []))


def test_fabric_takeover_moves_both_claims_aside_visibly_then_applies_the_fabric(monkeypatch):
    claimed_worker(f"netplan_claim={CX7}", f"nm_claim={NM_PROFILE}|cx7-port1")
    dry = run(
        ["--dry", "--diff", "--data", "fabric_takeover=True", "tests/plan/inventory_state.py",
         "deploy.py"],
        monkeypatch,
    )  # fmt: skip
    assert dry.exit_code == 0, dry.output
    assert f"Will move {CX7} to /var/lib/sparkrig/displaced{CX7}" in dry.output
    assert f"Will move {NM_PROFILE} to /var/lib/sparkrig/displaced{NM_PROFILE}" in dry.output
    takeover = "Move other configurations of the fabric NIC aside (fabric_takeover)"
    assert any(op.endswith(takeover) for op in dry.changed_ops[WORKER])
    assert not any(op.endswith(takeover) for op in dry.changed_ops.get(HEAD, []))

    r = apply(monkeypatch, "--data", "fabric_takeover=True")
    assert r.exit_code == 0, r.output
    worker = r.commands[WORKER]
    moves = [i for i, c in enumerate(worker) if f"mv -f {CX7}" in c]
    assert moves and f"mv -f {NM_PROFILE}" in worker[moves[0]]
    assert "nmcli connection reload" in worker[moves[0]]
    assert moves[0] < worker.index(UP_FABRIC)


def test_the_fabric_is_applied_without_netplan_apply_and_for_networkmanager(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        cmds = r.commands[name]
        assert not any("netplan apply" in c for c in cmds)
        gen = cmds.index("netplan generate")
        assert cmds[gen + 1 : gen + 3] == ["nmcli connection reload", UP_FABRIC]
        netplan = r.uploads[name]["/etc/netplan/60-sparkrig-fabric.yaml"].decode()
        assert "    enp1s0f1np1:\n      renderer: NetworkManager  #" in netplan


def test_networkmanager_not_running_stops_the_run_at_preflight(monkeypatch):
    report = fakehosts.node_report()
    fakehosts.inject(
        "spark-b",
        {
            fakehosts.NODE: [
                "networkmanager=inactive" if line.startswith("networkmanager=") else line
                for line in report
            ]
        },
    )
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert "NetworkManager is not running (systemctl is-active: inactive)" in r.output
    assert all(r.uploads.get(name, {}) == {} for name in (HEAD, WORKER))


def test_four_nodes_prove_the_mtu_between_every_pair_of_ranks(monkeypatch):
    r = run(["-y", "tests/plan/inventory_4nodes.py", "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    ips = {f"@fake/spark-{n}": f"192.168.100.{10 + i}" for i, n in enumerate("abcd")}
    pinged: set[tuple[str, str]] = set()
    for name, ip in ips.items():
        pings = [c for c in r.commands[name] if c.startswith("ping -M do -s 8972")]
        assert pings, f"{name} proved no MTU"
        for other in ips.values():
            if f" {other} >/dev/null" in pings[-1]:
                pinged.add((ip, other))
    want = {(a, b) for a in ips.values() for b in ips.values() if a != b}
    assert pinged == want, sorted(want - pinged)


PAIR_TOKEN, HUB_TOKEN = "/etc/sparkrig/pair-token", "/etc/sparkrig/hf-token"
SECRETS = {HEAD: (HUB_TOKEN, PAIR_TOKEN), WORKER: (PAIR_TOKEN,)}


def test_secrets_are_written_through_stdin_to_a_0600_temp_file_then_renamed(monkeypatch, tmp_path):
    from sparkrig.owned import secret_temp
    from sparkrig.secretio import INSTALL_SCRIPT

    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 30)
    r = apply(monkeypatch, *gated_locks(tmp_path))
    assert r.exit_code == 0, r.output
    assert 't="$1.sparkrig-new"' in INSTALL_SCRIPT and 'mv -f "$t" "$1"' in INSTALL_SCRIPT
    for name, dests in SECRETS.items():
        for dest in dests:
            tmp = secret_temp(dest)
            assert tmp.startswith(dest.rsplit("/", 1)[0] + "/")  # same directory: rename is atomic
            assert [c for c, fed in r.stdin[name] if f" {dest} " in c and fed not in c]
            assert dest in r.uploads[name] and tmp not in r.uploads[name]


def test_a_failed_secret_upload_leaves_the_old_secret_in_place(monkeypatch):
    r = run(["-y", INVENTORY, "deploy.py"], monkeypatch, fail_upload="/etc/sparkrig/pair-token")
    assert r.exit_code != 0
    for name in (HEAD, WORKER):
        touched = [c for c in r.commands.get(name, []) if c.endswith(" /etc/sparkrig/pair-token")]
        assert touched == [], touched  # neither emptied nor renamed over


PACKAGE = "/opt/sparkrig/lib/sparkhost"
HELPER_RESTART = re.compile(
    r"^systemctl (?:restart|reload) sparkrig-(pair|agent|supervisor|watchdog)\.service"
)


@pytest.mark.parametrize(
    ("module", "helpers"),
    [
        ("pair.py", True),  # the pair job itself
        ("tokenfile.py", True),  # imported by the pair job (the agents' secret)
        ("pairmac.py", True),  # imported by the pair job (the signed helper calls)
        ("helperhttp.py", True),  # imported by the pair job (the helpers' servers)
        ("wedge.py", True),  # imported by the pair job (the watchdog's probe)
        ("__main__.py", True),  # every job starts through it
        ("gid.py", False),  # the start gate's: read again at the next start, restarts nothing
        ("fetch.py", False),
    ],
)
def test_a_changed_host_module_restarts_exactly_the_helpers_that_run_it(
    monkeypatch, module, helpers
):
    """The helpers (stop-together watch, agent, supervisor, watchdog) have the pair job's modules
    loaded: a change to one of them restarts them (the watch is reloaded: it keeps its beacon's
    socket), beside a serving pair; any other module restarts nothing. Neither restarts the pair."""
    path = f"{PACKAGE}/{module}"
    converge_state(
        **{n: {"files": {path: (b"# an older module\n", "644")}} for n in ("spark-a", "spark-b")}
    )
    r = apply(monkeypatch)
    for name in (HEAD, WORKER):
        assert path in r.uploads[name], r.uploads[name].keys()
        restarted = {m.group(1) for c in r.commands[name] if (m := HELPER_RESTART.match(c))}
        want = {"pair", "supervisor", "watchdog"} if name == HEAD else {"pair", "agent"}
        assert restarted == (want if helpers else set()), (name, r.commands[name])
    assert_no_restart(r)


LEGACY_OP = "Remove the programs the host package replaced"


def old_layout_programs() -> dict[str, tuple[bytes, str]]:
    """What a rank converged before the host package still holds: bin/sparkrig-prep,
    bin/sparkrig-fetch, bin/sparkrig-pair and sparkrig_gate.py under install_dir."""
    s = next(iter(settings().values()))
    old = b"#!/usr/bin/python3\n# a host program of sparkrig before the host package\n"
    return {path: (old, "755") for path in hostpkg.legacy_files(s.knobs.install_dir)}


def test_the_programs_of_the_old_layout_are_removed_and_dry_shows_it(monkeypatch):
    """The deploy removes what it no longer ships: --dry names the removal of every old program
    on every rank, -y removes each of them, and nothing restarts for it."""
    old = old_layout_programs()
    assert len(old) == 4
    converge_state(**{n: {"files": old} for n in ("spark-a", "spark-b")})
    dry = run(["--dry", INVENTORY, "deploy.py"], monkeypatch)
    assert dry.exit_code == 0, dry.output
    for name in (HEAD, WORKER):
        removals = [op for op in dry.changed_ops[name] if op.endswith(LEGACY_OP)]
        assert len(removals) == len(old), dry.changed_ops[name]
        assert not any(c.startswith("rm ") for c in dry.commands[name])  # --dry: nothing ran
    converge_state(**{n: {"files": old} for n in ("spark-a", "spark-b")})
    r = apply(monkeypatch)
    for name in (HEAD, WORKER):
        removed = sorted(c.removeprefix("rm -f ") for c in r.commands[name] if c.startswith("rm "))
        assert removed == sorted(old), r.commands[name]
    assert_no_restart(r)


def test_a_converged_pair_has_no_old_programs_to_remove(monkeypatch):
    converge_state()
    dry = run(["--dry", INVENTORY, "deploy.py"], monkeypatch)
    assert dry.exit_code == 0, dry.output
    for name in (HEAD, WORKER):
        assert any(op.endswith(LEGACY_OP) for op in dry.host_ops[name])  # every host runs it, ...
        assert not [op for op in dry.changed_ops[name] if op.endswith(LEGACY_OP)]  # ... a no-op


def test_a_new_host_package_reloads_the_watch_and_the_pair_keeps_serving(monkeypatch):
    """Issue 31: a run that changes only the host package (an upgrade of sparkrig itself, or
    /opt/sparkrig removed) reloads the stop-together watch, which keeps its beacon's socket
    across the exec; no rank is stopped or started, on any host."""
    from sparkrig import hostpkg

    head = settings()[HEAD]
    pair_py = f"{hostpkg.remote_dir(head.knobs.install_dir)}/pair.py"
    _, mode = fakehosts.owned_files(head)[pair_py]
    converge_state(**{"spark-a": {"files": {pair_py: (b"# an older pair job\n", mode)}}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert "systemctl reload sparkrig-pair.service" in r.commands[HEAD]
    assert not any("restart sparkrig-pair" in c for c in r.commands[HEAD])
    for name in (HEAD, WORKER):
        ranks = [
            c
            for c in r.commands.get(name, [])
            if re.match(r"systemctl \w+ sparkrig-(head|work)", c)
        ]
        assert ranks == [], f"{name}: {ranks}"
