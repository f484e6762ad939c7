"""fabric_layout "ports" applied to a pair (issue 36 item 1, docs/rings.md) through the real CLI
against strict @fake hosts: both PCIe functions of the cable addressed, activated one profile
each, proven with don't-fragment pings, named in the rank env (no GID index pinned), accepted by
the firewall and measured by the smoke test against the two-function floor; a cable in the wrong
port or a silent function refused before any address is set."""

from __future__ import annotations

import re

import pytest

from sparkrig.firewall import ruleset_path
from sparkrig.paths import paths
from tests.plan import fakehosts
from tests.plan.harness import Run, run
from tests.plan.rings import pairfakes

INVENTORY = "tests/plan/rings/pair_ports.py"
HEAD, WORKER = "@fake/spark-a", "@fake/spark-b"
TWIN_UP = "nmcli --wait 90 connection up netplan-enP2p1s0f1np1"
PRIMARY_UP = "nmcli --wait 90 connection up netplan-enp1s0f1np1"


def apply(monkeypatch, *extra: str) -> Run:
    return run(["-y", *extra, INVENTORY, "deploy.py"], monkeypatch)


def settings():
    return fakehosts.settings_of(INVENTORY)


def state(short: str, rank: int, **kw) -> None:
    fakehosts.inject(short, pairfakes.fabric_state(rank, **kw))


def env_of(r: Run, name: str) -> dict[str, str]:
    s = settings()[name]
    text = r.uploads[name][paths(s).env_file].decode()
    return dict(x.split("=", 1) for x in text.splitlines() if x and not x.startswith("#"))


# (NCCL_IB_HCA, floor) of each NCCL smoke run on a rank of a pair on both functions, in order
SMOKE_RUNS = [
    (None, "16"),  # the rank's env file: both devices
    ("=rocep1s0f1:1", "8"),
    ("=roceP2p1s0f1:1", "8"),
]


def smoke_runs(cmds: list[str]) -> list[tuple[str | None, str]]:
    out = []
    for c in cmds:
        if c.startswith("docker run") and " nccl-smoke " in c:
            hca = re.search(r"--env NCCL_IB_HCA=(\S+)", c)
            floor = re.search(r"--min-busbw-gbs (\S+)", c)
            assert floor, c
            out.append((hca.group(1) if hca else None, floor.group(1)))
    return out


def test_a_bare_pair_gets_both_functions_addressed_named_and_measured(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for name, s in settings().items():
        cmds = r.commands[name]
        # every fabric netdev's profile activated alone, after the netplan file
        assert PRIMARY_UP in cmds and TWIN_UP in cmds
        assert "netplan apply" not in " ".join(cmds)
        files = r.uploads[name]
        netplan = files[s.knobs.fabric_netplan_file].decode()
        for dev, _, ip in pairfakes.PLAN[s.me.rank]:
            assert f"    {dev}:" in netplan and f"- {ip}/24" in netplan
        assert netplan.count("mtu: 9000") == 2
        # both devices in NCCL_IB_HCA, no index pinned in the env nor handed to the container
        env = env_of(r, name)
        assert env["NCCL_IB_HCA"] == "=rocep1s0f1:1,roceP2p1s0f1:1"
        assert env["SPARKRIG_ROCE_DEVICES"] == "rocep1s0f1,roceP2p1s0f1"
        assert "NCCL_IB_GID_INDEX" not in env
        unit = files[paths(s).rank_unit].decode()
        assert "NCCL_IB_GID_INDEX" not in unit
        # the firewall accepts the peer on both functions, on both netdevs
        rules = files[ruleset_path(s)].decode()
        peer = 1 - s.me.rank
        peers = ", ".join(ip for _, _, ip in pairfakes.PLAN[peer])
        assert f"elements = {{ {peers} }}" in rules
        assert 'iifname { "enp1s0f1np1", "enP2p1s0f1np1" } ip saddr @fabric_peers accept' in rules
        # the smoke test holds the pair to the two-function floor, then each function alone
        # to one function's
        assert smoke_runs(cmds) == SMOKE_RUNS
    # each function proven by its own don't-fragment ping on both ends
    for name in (HEAD, WORKER):
        assert any(c.startswith("rc=0; ping -M do -s 8972") and "enP2p1s0f1np1" in c
                   for c in r.commands[name])  # fmt: skip


def test_a_cable_in_the_other_port_is_refused_before_any_address(monkeypatch):
    # the cable joins spark-a's port 0 and spark-b's port 1; the inventory says port 1 on both
    state("spark-a", 0, probe={"cable": (0, 1)})
    state("spark-b", 1, probe={"cable": (0, 1)})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert (
        "@fake/spark-b port 1 reaches @fake/spark-a port 0 (the pair's cable is elsewhere than "
        "fabric_interface says); cable 0 must join @fake/spark-b port 1 and @fake/spark-a port 1: "
        "move the cable end at @fake/spark-a port 0 to @fake/spark-a port 1"
    ) in r.output
    for name, s in settings().items():
        assert s.knobs.fabric_netplan_file not in r.uploads.get(name, {})
        assert not [c for c in r.commands[name] if c.startswith(("nmcli", "netplan"))]


def test_a_silent_twin_is_refused_by_name_or_left_out_of_the_env(monkeypatch):
    for short, rank in (("spark-a", 0), ("spark-b", 1)):
        silent = ("enP2p1s0f1np1",) if rank == 1 else ()
        state(short, rank, links={"addressed": True, "silent": silent, "mtu": 9000})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert (
        "cable 0 twin (@fake/spark-a enP2p1s0f1np1 to @fake/spark-b enP2p1s0f1np1) does not "
        "answer a full-MTU don't-fragment ping both ways (fabric_link_silent = 'omit' leaves "
        "it out)"
    ) in r.output
    assert not any(c.startswith("nmcli") for cmds in r.commands.values() for c in cmds)

    omitted = apply(monkeypatch, "--data", "fabric_link_silent=omit")
    assert omitted.exit_code == 0, omitted.output
    assert "does not answer a full-MTU don't-fragment ping both ways: left out" in omitted.output
    for name in (HEAD, WORKER):
        env = env_of(omitted, name)
        assert env["NCCL_IB_HCA"] == "=rocep1s0f1:1"
        assert env["SPARKRIG_FABRIC_NETDEVS"] == "enp1s0f1np1"


def test_a_function_silent_after_the_addresses_are_applied_fails_naming_it(monkeypatch):
    fakehosts.inject("spark-b", {pairfakes.PROVE: {"success": False, "stderr": "cable 0 twin"}})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    ran = r.commands[WORKER]
    prove = next(i for i, c in enumerate(ran) if c.startswith("rc=0; ping -M do"))
    assert (
        "cable 0 twin (@fake/spark-a enP2p1s0f1np1 to @fake/spark-b enP2p1s0f1np1) does not answer"
        in ran[prove]
    )
    assert not any("sparkrig-nccl-smoke" in c for c in ran[prove:])


def converged_pair(**runtime: dict[str, str]) -> None:
    """Both ranks converged and serving in the ports layout, both functions addressed; a rank
    named in ``runtime`` has those per-device fields in its start gate's hand-over."""
    for name, s in settings().items():
        short = name.split("/")[1]
        canned = fakehosts.converged(s)
        canned.update(pairfakes.fabric_state(s.me.rank, links={"addressed": True, "mtu": 9000}))
        (_, primary, _), (_, twin, _) = pairfakes.PLAN[s.me.rank]
        fields = {  # as the start gate hands over: each device's live GID index and kernel index
            "per_device": f"{primary}:3,{twin}:5",
            "device_indexes": f"{primary}:4,{twin}:6",
            "live_device_indexes": f"{primary}:4,{twin}:6",
            **runtime.get(short, {}),
        }
        canned[fakehosts.RANK_RUNTIME] = fakehosts.rank_runtime("running", 3, 4, 4, **fields)
        fakehosts.STATE[short] = canned


def worker_links(**changed: dict) -> None:
    """The worker's FabricLinks answer: both functions addressed, up with carrier, at MTU 9000,
    their pings answered, but for what ``changed`` says of the "primary" or the "twin" (keys
    df: 1 a failed ping, flags, carrier, mtu)."""
    lines = []
    for role, (dev, _, ip) in zip(("primary", "twin"), pairfakes.PLAN[1], strict=True):
        end = {"df": 0, "flags": "0x1003", "carrier": 1, "mtu": 9000, **changed.get(role, {})}
        lines += [f"df {dev} {end['df']}", f"link {dev} {end['flags']} {end['carrier']} "
                  f"{end['mtu']}", f"addr {dev} {ip}/24"]  # fmt: skip
    fakehosts.inject("spark-b", {pairfakes.LINKS: [*lines, fakehosts.END]})


def restarts(r: Run) -> list[str]:
    return [c for n in (HEAD, WORKER) for c in r.commands[n]
            if re.match(r"systemctl (stop|start) sparkrig-(head|worker)", c)]  # fmt: skip


def test_a_converged_pair_in_the_ports_layout_changes_nothing(monkeypatch):
    converged_pair()  # both devices as their start gate handed them over
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert r.changed_ops == {} and r.uploads == {}
    assert restarts(r) == []


@pytest.mark.parametrize(
    ("runtime", "said"),
    [
        # the twin's GID table renumbered under the running rank (the primary's did not)
        ({"per_device": "rocep1s0f1:3,roceP2p1s0f1:4"}, "RoCE GID index 4 on roceP2p1s0f1, "
         "the live table 5"),
        # the twin's device made again (a firmware reset of that function): a new kernel index
        ({"live_device_indexes": "rocep1s0f1:4,roceP2p1s0f1:9"}, "roceP2p1s0f1 at RDMA device "
         "index 6, now 9"),
        ({"live_device_indexes": "rocep1s0f1:4,roceP2p1s0f1:"}, "roceP2p1s0f1 at RDMA device "
         "index 6, now gone"),
    ],
    ids=["twin-gid-moved", "twin-made-again", "twin-gone"],
)  # fmt: skip
def test_the_twin_changed_under_a_running_rank_restarts_the_pair(monkeypatch, runtime, said):
    converged_pair(**{"spark-b": runtime})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert "rm -f /run/sparkrig/gid.env" in r.commands[WORKER]
    assert "rm -f /run/sparkrig/gid.env" not in r.commands[HEAD]
    assert said in r.output
    assert "systemctl stop sparkrig-worker.service" in restarts(r)
    assert "systemctl stop sparkrig-head.service" in restarts(r)


def test_a_netplan_file_naming_the_twin_stops_the_run_at_preflight(monkeypatch):
    # the node report lists claims on every fabric netdev of the plan (tests/unit/
    # test_node_claims.py runs the real command); the twin's is named with the primary
    claims = ("netplan_claim=/etc/netplan/40-cx7.yaml",)
    fakehosts.inject("spark-b", {fakehosts.NODE: fakehosts.node_report(claims=claims)})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert (
        "fabric interface enp1s0f1np1 or enP2p1s0f1np1 is also configured by the netplan file "
        "/etc/netplan/40-cx7.yaml"
    ) in r.output
    assert all(r.uploads.get(n, {}) == {} for n in (HEAD, WORKER))


def test_an_administratively_down_twin_is_brought_up_and_the_pair_restarts(monkeypatch):
    # `ip link set dev enP2p1s0f1np1 down` on the worker of a serving pair: the twin keeps its
    # address, has no carrier and its don't-fragment ping fails, like a dead cable would
    converged_pair()
    (dev0, _, _), (dev1, _, _) = pairfakes.PLAN[1]
    worker_links(twin={"df": 1, "flags": "0x1002", "carrier": 0})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    worker = r.commands[WORKER]
    assert f"ip link set dev {dev1} up" in worker
    assert f"ip link set dev {dev0} up" not in worker
    assert worker.index(f"ip link set dev {dev1} up") < worker.index(TWIN_UP)
    assert "systemctl stop sparkrig-worker.service" in restarts(r)


def test_a_function_whose_mtu_was_reset_is_applied_again_not_refused_as_silent(monkeypatch):
    # `ip link set dev enp1s0f1np1 mtu 1500` on the worker of a serving pair (a firmware
    # update): the primary keeps its address, its full-MTU don't-fragment ping fails; the run
    # re-applies the netplan and proves it after, as for a link not yet addressed
    converged_pair()
    dev0 = pairfakes.PLAN[1][0][0]
    worker_links(primary={"df": 1, "mtu": 1500})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert "does not answer a full-MTU" not in r.output
    worker = r.commands[WORKER]
    assert PRIMARY_UP in worker and "netplan generate" in worker
    assert any(c.startswith("rc=0; ping -M do -s 8972") and dev0 in c for c in worker)
    assert "systemctl stop sparkrig-worker.service" in restarts(r)


def test_limit_worker_on_both_functions_never_reaches_the_head(monkeypatch):
    # the worker's MTU reset (a firmware update) fixed with --limit worker: the cable checks
    # read only the ranks of the run; the head's end is left to the worker's pings
    converged_pair()
    dev0 = pairfakes.PLAN[1][0][0]
    worker_links(primary={"df": 1, "mtu": 1500})
    r = apply(monkeypatch, "--limit", "worker")
    assert r.exit_code == 0, r.output
    assert r.commands.get(HEAD, []) == []
    assert "not checked: @fake/spark-a is not in this run" in r.output
    worker = r.commands[WORKER]
    assert PRIMARY_UP in worker
    assert any(c.startswith("rc=0; ping -M do -s 8972") and dev0 in c for c in worker)


def test_todays_pair_inventory_serves_on_both_functions_by_default(monkeypatch):
    inventory = "tests/plan/rings/pair_today.py"
    r = run(["-y", inventory, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    for name, s in fakehosts.settings_of(inventory).items():
        assert s.knobs.fabric_layout == "auto" and s.layout == "ports"
        files = r.uploads[name]
        netplan = files[s.knobs.fabric_netplan_file].decode()
        for dev, _, ip in pairfakes.TODAY[s.me.rank]:  # the typed primary kept, the twin's buddy
            assert f"    {dev}:" in netplan and f"- {ip}/24" in netplan
        text = files[paths(s).env_file].decode()
        env = dict(x.split("=", 1) for x in text.splitlines() if x and not x.startswith("#"))
        assert env["NCCL_IB_HCA"] == "=rocep1s0f1:1,roceP2p1s0f1:1"
        assert env["NCCL_IB_ADDR_RANGE"] == "10.200.0.0/23"
        assert PRIMARY_UP in r.commands[name] and TWIN_UP in r.commands[name]
        assert smoke_runs(r.commands[name]) == SMOKE_RUNS
