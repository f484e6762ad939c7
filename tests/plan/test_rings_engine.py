"""The ring's engine applied (issue 36 item 3): stack `tensorfold-ring` on a triangle of three and
a ring of four in fabric_layout "ports", through the real CLI against strict @fake hosts cabled as
the rule says (tests/plan/rings/ringfakes.py). Nothing here ran on a lab or on Sparks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkrig.factlines import END
from tests.image.fakeimage import converged_image_state
from tests.plan import fakehosts
from tests.plan.harness import Run, run
from tests.plan.rings import ringfakes
from tests.plan.test_stack_tensorfold_plan import tf_locks

INVENTORIES = {
    3: "tests/plan/rings/ring_three_state.py",
    4: "tests/plan/rings/ring_four_state.py",
}
NAMES = ["spark-a", "spark-b", "spark-c", "spark-d"]
UNITS = "/etc/systemd/system/"


def ring_args(tmp: Path, *extra: str) -> list[str]:
    """The stack switch of a tensorfold run (tests/plan/test_stack_tensorfold_plan.py): the
    pair's lockfiles serve the ring (the same pins), profile single loads no drafter."""
    return ["--data", "stack=tensorfold-ring", "--data", "profile=single",
            "--data", f"lockfile_dir={tf_locks(tmp)}", "--data", "reach_check=False",
            *extra]  # fmt: skip


def ring_run(monkeypatch, tmp: Path, nnodes: int, *extra: str, dry: bool = False) -> Run:
    flags = ["--dry"] if dry else ["-y"]
    return run([*flags, *ring_args(tmp, *extra), INVENTORIES[nnodes], "deploy.py"], monkeypatch)


def unit_name(rank: int) -> str:
    return "sparkrig-head" if rank == 0 else "sparkrig-worker"


def names(nnodes: int) -> list[str]:
    return [f"@fake/{n}" for n in NAMES[:nnodes]]


@pytest.mark.parametrize("nnodes", [3, 4])
def test_tensorfold_ring_on_a_triangle_and_a_ring_is_deployed(monkeypatch, tmp_path, nnodes):
    r = ring_run(monkeypatch, tmp_path, nnodes)
    assert r.exit_code == 0, r.output
    for rank, name in enumerate(names(nnodes)):
        unit = r.uploads[name][f"/etc/systemd/system/{unit_name(rank)}.service"].decode()
        assert "--entrypoint tensorfold" in unit and f"--tp {nnodes} \\\n" in unit, unit
        assert f"--rank {rank} \\\n" in unit
        assert f"systemctl start {unit_name(rank)}" in "\n".join(r.commands[name])


def test_an_env_the_engine_cannot_run_with_is_refused_before_any_host_naming_rank_and_key(
    monkeypatch, tmp_path
):
    # the knob nccl_env lands after the fabric env in every rank's env file: a tree algorithm on
    # a ring of four, or a pinned GID index, is what the engine's needs refuse
    env = '{"NCCL_ALGO": "Tree", "NCCL_IB_GID_INDEX": "3"}'
    r = ring_run(monkeypatch, tmp_path, 4, "--data", f"nccl_env={env}")
    assert r.exit_code != 0
    said = str(r.exception) + r.output
    for rank, name in enumerate(names(4)):
        assert (
            f"{name}: rank {rank}'s env for stack 'tensorfold-ring': NCCL_ALGO=Ring needed, the "
            "fabric env has 'Tree' (set by the knob nccl_env)"
        ) in said
        assert (
            f"{name}: rank {rank}'s env for stack 'tensorfold-ring': NCCL_IB_GID_INDEX is pinned"
        ) in said
    assert all(cmds == [] for cmds in r.commands.values()), r.commands


GRAPHS = Path("tests/stacks/data/tensorfold-ring-graphs")  # MiaAI's generator's output, by rank


def env_file(r: Run, name: str) -> dict[str, str]:
    text = r.uploads[name]["/etc/sparkrig/rank.env"].decode()
    return dict(x.split("=", 1) for x in text.splitlines() if x and not x.startswith("#"))


def test_a_ring_of_four_gets_its_graph_files_written_and_mounted_where_the_env_names_them(
    monkeypatch, tmp_path
):
    r = ring_run(monkeypatch, tmp_path, 4)
    assert r.exit_code == 0, r.output
    for rank, name in enumerate(names(4)):
        env = env_file(r, name)
        named = [env["NCCL_GRAPH_FILE"], *env["TF_NCCL_RING_GRAPHS"].split(",")]
        assert named == ["/nccl-graph.xml", "/nccl-link-prev.xml", "/nccl-link-next.xml"]
        unit = r.uploads[name][f"/etc/systemd/system/{unit_name(rank)}.service"].decode()
        for container, data in zip(named, ("", "-link-prev", "-link-next"), strict=True):
            host = f"/etc/sparkrig{container}"
            # whole files under the config dir, byte for byte MiaAI's graph_xml for this rank
            assert r.uploads[name][host].decode() == (GRAPHS / f"rank{rank}{data}.xml").read_text()
            assert f"--volume {host}:{container}:ro \\\n" in unit  # read-only, at the named path
        # the NCCL smoke test reads the same env file: it gets the same mounts
        smoke = next(c for c in r.commands[name] if "--name sparkrig-nccl-smoke" in c)
        assert "--volume /etc/sparkrig/nccl-graph.xml:/nccl-graph.xml:ro" in smoke


def test_a_triangle_has_no_graph_file_and_one_left_over_is_removed(monkeypatch, tmp_path):
    left = "/etc/sparkrig/nccl-link-next.xml"  # e.g. from a ring of four the inventory was
    fakehosts.inject("spark-b", {fakehosts.owned_of(left): "file 644 root root " + "0" * 64})
    r = ring_run(monkeypatch, tmp_path, 3)
    assert r.exit_code == 0, r.output
    assert f"rm -f {left}" in r.commands["@fake/spark-b"]
    for name in names(3):
        assert "NCCL_GRAPH_FILE" not in env_file(r, name)
        assert not [p for p in r.uploads[name] if p.endswith(".xml")]
        # the state read still looks at them (owned files: a ring's left over would go) ...
        read = next(c for c in r.commands[name] if "##SPARKRIG-PART" in c)
        assert all(f"/etc/sparkrig/{x}.xml" in read for x in ("nccl-graph", "nccl-link-prev"))
        # ... and removes the one left over, mounts none
        removed = [c for c in r.commands[name] if c.startswith("rm -f /etc/sparkrig/nccl-")]
        assert removed == ([f"rm -f {left}"] if name == "@fake/spark-b" else [])
        unit = r.uploads[name][f"/etc/systemd/system/{unit_name(names(3).index(name))}.service"]
        assert b".xml" not in unit


def test_the_ranks_start_last_to_first_each_seen_running_before_the_next(monkeypatch, tmp_path):
    r = ring_run(monkeypatch, tmp_path, 4)
    assert r.exit_code == 0, r.output
    # where the head dials each worker: its end of the cable they share (ranks 1 and 3), rank
    # 2's end of the cable from rank 1, the way the route goes (ringfakes' addresses)
    ips = {3: "198.18.6.1", 2: "198.18.2.2", 1: "198.18.0.2"}
    order = [op.split(" | ")[-1] for op in r.op_order if op.startswith("tasks/start.py")]
    order = [op for op in order if op.startswith(("Start the", "Wait until every worker"))]
    waves = [
        (f"Start the worker rank (rank {n} of 4)",
         f"Wait until every worker's container runs (rank {n} of 4)") for n in (3, 2, 1)
    ]  # fmt: skip
    assert order == [*(op for wave in waves for op in wave), "Start the head rank"]
    # the rollback's ordered start (tasks/rollback.py) is the same one
    back = [op.split(" | ")[-1] for op in r.op_order if "| Roll back" in op]
    back = [op for op in back if op.startswith(("Start the", "Wait until every worker"))]
    assert back == [
        *(op for n in (3, 2, 1)
          for op in (f"Start the worker rank of the previous release (rank {n} of 4)",
                     f"Wait until every worker of the previous release runs (rank {n} of 4)")),
        "Start the head rank of the previous release",
    ]  # fmt: skip
    head, *workers = names(4)
    for n, name in enumerate(workers, start=1):
        # each worker acts in its own wave only
        started = [op.split(" | ")[-1] for op in r.changed_ops[name] if "| Start the w" in op]
        assert started == [waves[3 - n][0]]
    # the head waits for the wave's rank alone, in the stack's order
    waits = [c for c in r.commands[head] if " pair wait --peers " in c]
    assert [re.search(r"--peers (\S+)", c)[1] for c in waits] == [ips[3], ips[2], ips[1]]
    # the head's start gate, its supervisor and its restart command keep that order
    files = r.uploads[head]
    in_order = f"{ips[3]},{ips[2]},{ips[1]}"
    unit = files["/etc/systemd/system/sparkrig-head.service"].decode()
    assert re.search(rf"pair wait --peers {in_order} .* --in-turn\n", unit), unit
    for path in ("/etc/systemd/system/sparkrig-supervisor.service",
                 "/opt/sparkrig/bin/sparkrig-restart-pair"):  # fmt: skip
        assert f"--workers {in_order} " in files[path].decode()
        assert " --in-turn" in files[path].decode(), path


def test_a_triangle_starts_rank_2_then_rank_1_then_the_head(monkeypatch, tmp_path):
    r = ring_run(monkeypatch, tmp_path, 3)
    assert r.exit_code == 0, r.output
    order = [op.split(" | ")[-1] for op in r.op_order if op.startswith("tasks/start.py")]
    assert [op for op in order if op.startswith("Start the")] == [
        "Start the worker rank (rank 2 of 3)",
        "Start the worker rank (rank 1 of 3)",
        "Start the head rank",
    ]


def listens(unit: str) -> set[str]:
    """The addresses of a helper unit's ``--listen``."""
    return {a.rpartition(":")[0] for a in re.search(r"--listen (\S+)", unit)[1].split(",")}


@pytest.mark.parametrize("nnodes", [3, 4])
def test_the_helpers_listen_where_each_peer_dials_and_dial_each_peer_where_it_listens(
    monkeypatch, tmp_path, nnodes
):
    """On a triangle rank 0 has no route to rank 1's first address, and on a ring of four the
    head reaches rank 3 only out of its port 1: each rank dials each peer at the address the
    plan gives it, and listens on every address a peer dials it at, its sockets routed, not
    bound to one netdev. The addresses each rank holds are ringfakes' (the cabling rule), not
    topology's."""
    r = ring_run(monkeypatch, tmp_path, nnodes)
    assert r.exit_code == 0, r.output
    files = {rank: r.uploads[name] for rank, name in enumerate(names(nnodes))}
    held = {rank: {ip for _, _, ip, _ in ringfakes.plan(nnodes, rank)} for rank in files}
    beacon = {
        rank: listens(f[UNITS + "sparkrig-pair.service"].decode()) for rank, f in files.items()
    }
    for rank, f in files.items():
        assert beacon[rank] <= held[rank] and len(beacon[rank]) >= 2, (rank, beacon[rank])
        for path in [p for p in f if p.startswith(UNITS) and "sparkrig-" in p]:
            assert "--bind-device" not in f[path].decode(), path  # routed, never bound
    dialed: dict[int, set[str]] = {rank: set() for rank in files}
    head = files[0][UNITS + "sparkrig-head.service"].decode()
    supervisor = files[0][UNITS + "sparkrig-supervisor.service"].decode()
    workers = re.search(r"--workers (\S+)", supervisor)[1].split(",")
    assert re.search(r"pair wait --peers (\S+)", head)[1].split(",") == workers
    for rank, ip in zip(range(nnodes - 1, 0, -1), workers, strict=True):  # last to first
        dialed[rank].add(ip)
    assert listens(supervisor) == beacon[0]
    for rank in range(1, nnodes):
        f = files[rank]
        peer = re.search(r"--peers (\S+)", f[UNITS + "sparkrig-pair.service"].decode())[1]
        assert "," not in peer  # a worker watches the head alone
        alone = re.search(r"pair alone --head (\S+)", f[UNITS + "sparkrig-worker.service"].decode())
        assert alone[1] == peer
        dialed[0].add(peer)
        assert listens(f[UNITS + "sparkrig-agent.service"].decode()) == beacon[rank]
    # every address a peer dials, the rank listens on: never one it cannot be reached at
    for rank in files:
        assert dialed[rank] <= beacon[rank], (rank, dialed[rank], beacon[rank])
    assert dialed[0] == beacon[0]  # and the head listens on no address nobody dials
    # the weights: the head serves on each address, each worker fetches from its own way in
    serve = next(c for c in r.commands[names(nnodes)[0]] if " serve --dir " in c)
    assert {a.rpartition(":")[0] for a in re.search(r"--listen (\S+)", serve)[1].split(",")} == (
        beacon[0]
    )
    assert "--bind-device" not in serve
    for rank in range(1, nnodes):
        fetch = next(c for c in r.commands[names(nnodes)[rank]] if "--base-url http://" in c)
        host = re.search(r"--base-url http://([^:/]+):", fetch)[1]
        assert host in beacon[0] and "--uplink=default" in fetch, fetch


@pytest.mark.parametrize("nnodes", [3, 4])
def test_the_ranks_meet_at_the_heads_lan_address_and_only_the_ranks_reach_it(
    monkeypatch, tmp_path, nnodes
):
    """TensorFold's TP>2 rule (research tensorfold.md: config.sh): `--master` is the head's LAN
    address on every rank, NCCL and gloo bootstrap on the LAN; the head's firewall accepts the
    rendezvous ports from the other ranks' LAN addresses alone, a worker's accepts none; every
    rank's accepts the bootstrap's ephemeral ports from the other ranks' LAN addresses alone."""
    r = ring_run(monkeypatch, tmp_path, nnodes)
    assert r.exit_code == 0, r.output
    lan = ringfakes.lan_address
    for rank, name in enumerate(names(nnodes)):
        unit = r.uploads[name][UNITS + f"{unit_name(rank)}.service"].decode()
        assert f"--master {lan(0)} \\\n" in unit, unit
        # NCCL's bootstrap off the fabric (the fakes name no uplink: every netdev but these)
        ifname = env_file(r, name)["NCCL_SOCKET_IFNAME"]
        assert ifname.startswith("^lo,docker,veth,") and "enp1s0f0np0" in ifname, ifname
        smoke = next(c for c in r.commands[name] if "--name sparkrig-nccl-smoke" in c)
        assert f"MASTER_ADDR={lan(0)}" in smoke
        rules = r.uploads[name]["/etc/sparkrig/firewall.nft"].decode()
        others = ", ".join(lan(n) for n in range(nnodes) if n != rank)
        accept = f"tcp dport {{ 29521, 29522, 29551 }} ip saddr {{ {others} }} accept"
        assert (accept in rules) == (rank == 0), rules
        # ... before the drop of the pair's ports off the fabric
        if rank == 0:
            assert rules.index(accept) < rules.index("pair ports off the fabric")
        # NCCL's and gloo's bootstrap on ephemeral ports: every rank's, from every other rank
        bootstrap = f"tcp dport 32768-60999 ip saddr {{ {others} }} accept"
        assert rules.index(bootstrap) < rules.index("ephemeral ports: not a rank"), rules


def test_a_lan_address_the_rank_does_not_hold_is_refused_before_any_change(monkeypatch, tmp_path):
    fakehosts.inject("spark-b", {ringfakes.LAN: ["enP7s7 192.168.1.99/24", END]})
    r = ring_run(monkeypatch, tmp_path, 3)
    assert r.exit_code != 0
    assert (
        "lan_address 192.168.1.11 is not an address of this host (its IPv4 addresses: "
        "192.168.1.99/24 on enP7s7)"
    ) in r.output
    for name in names(3):
        assert r.uploads.get(name, {}) == {}, f"{name} was changed"


def converged_ring(
    monkeypatch,
    tmp: Path,
    nnodes: int,
    files: dict[str, dict[str, tuple[bytes, str]]] | None = None,
    handed: dict[str, dict[str, int]] | None = None,
) -> None:
    """Every rank of the ring converged and serving `tensorfold-ring`: its owned files rendered
    (relay, forwarding and graph files included; ``files``: some of a rank's, by short name, as
    they are instead), every function addressed at MTU 9000, each device's GID and kernel index
    as its start gate handed them over (``handed``: some devices' GID index otherwise, by the
    rank's short name and device)."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    from sparkrig.config.inventory import build, view_of

    data = {"stack": "tensorfold-ring", "profile": "single", "lockfile_dir": tf_locks(tmp),
            "reach_check": False}  # ring_args' --data  # fmt: skip
    with ctx_state.use(State()):  # the CLI loads inventories inside a state
        view = view_of(make_inventory(INVENTORIES[nnodes], cwd=str(fakehosts.ROOT)))
    for group in view.groups.values():
        group[:] = [(name, {**host_data, **data}) for name, host_data in group]
    for name, s in build(view).items():
        short = name.split("/")[1]
        canned = fakehosts.converged(s, files=(files or {}).get(short))
        # the stack's own image by digest, no patch layer (the head pulled it, the workers got
        # the head's copy)
        canned.update(converged_image_state(s.image_ref, pulled=s.me.is_head, patched=False))
        canned.update(ringfakes.fabric_state(nnodes, s.me.rank,
                                             links={"addressed": True, "mtu": 9000}))  # fmt: skip
        devices = [rdma for _, rdma, _, _ in ringfakes.plan(nnodes, s.me.rank)]
        gid = {d: 3 + i for i, d in enumerate(devices)} | (handed or {}).get(short, {})
        canned[fakehosts.RANK_RUNTIME] = fakehosts.rank_runtime(
            "running", 3, 4, 4,
            per_device=",".join(f"{d}:{gid[d]}" for d in devices),
            device_indexes=",".join(f"{d}:{4 + i}" for i, d in enumerate(devices)),
            live_device_indexes=",".join(f"{d}:{4 + i}" for i, d in enumerate(devices)),
        )  # fmt: skip
        fakehosts.STATE[short] = canned


def rank_restarts(r: Run, nnodes: int) -> list[str]:
    return [c for name in names(nnodes) for c in r.commands[name]
            if re.match(r"systemctl (stop|start) sparkrig-(head|worker)", c)]  # fmt: skip


@pytest.mark.parametrize("nnodes", [3, 4])
def test_a_converged_ring_changes_nothing(monkeypatch, tmp_path, nnodes):
    converged_ring(monkeypatch, tmp_path, nnodes)
    r = ring_run(monkeypatch, tmp_path, nnodes)
    assert r.exit_code == 0, r.output
    assert r.changed_ops == {} and r.uploads == {}, r.changed_ops
    assert rank_restarts(r, nnodes) == []


def test_a_changed_graph_file_is_written_again_and_the_ring_restarts_in_order(
    monkeypatch, tmp_path
):
    """A graph file of spark-c that is not the plan's (an operator's edit, an older generator):
    written whole again, and since NCCL read it at the engine's start, every rank stops and the
    ring starts again last-to-first."""
    path = "/etc/sparkrig/nccl-link-prev.xml"
    converged_ring(monkeypatch, tmp_path, 4, files={"spark-c": {path: (b"<graphs/>\n", "644")}})
    r = ring_run(monkeypatch, tmp_path, 4)
    assert r.exit_code == 0, r.output
    assert list(r.uploads) == ["@fake/spark-c"] and list(r.uploads["@fake/spark-c"]) == [path]
    assert r.uploads["@fake/spark-c"][path].decode() == (GRAPHS / "rank2-link-prev.xml").read_text()
    stops = [c for c in rank_restarts(r, 4) if " stop " in c]
    assert len(stops) == 4, rank_restarts(r, 4)
    order = [op.split(" | ")[-1] for op in r.op_order if op.startswith("tasks/start.py")]
    started = [op for op in order if op.startswith("Start the")]
    assert started == [
        "Start the worker rank (rank 3 of 4)",
        "Start the worker rank (rank 2 of 4)",
        "Start the worker rank (rank 1 of 4)",
        "Start the head rank",
    ]
    for rank, name in enumerate(names(4)):
        assert f"systemctl start {unit_name(rank)}" in "\n".join(r.commands[name]), name


def started_in_order(r: Run) -> list[str]:
    order = [op.split(" | ")[-1] for op in r.op_order if op.startswith("tasks/start.py")]
    return [op for op in order if op.startswith("Start the")]


def test_a_gid_moved_on_one_port_of_one_rank_restarts_the_ring_in_order(monkeypatch, tmp_path):
    """Item 4 of the issue: spark-c's port 1 primary (rocep1s0f1) renumbered its GID table
    under the running rank (its live index 5, the start gate handed 9); its other devices did
    not move. The hand-over is dropped on that rank alone and every rank restarts, last-to-first."""
    converged_ring(monkeypatch, tmp_path, 4, handed={"spark-c": {"rocep1s0f1": 9}})
    r = ring_run(monkeypatch, tmp_path, 4)
    assert r.exit_code == 0, r.output
    assert "RoCE GID index 9 on rocep1s0f1, the live table 5" in r.output
    dropped = [n for n in names(4) if "rm -f /run/sparkrig/gid.env" in r.commands[n]]
    assert dropped == ["@fake/spark-c"]
    assert len([c for c in rank_restarts(r, 4) if " stop " in c]) == 4
    assert started_in_order(r) == [
        "Start the worker rank (rank 3 of 4)",
        "Start the worker rank (rank 2 of 4)",
        "Start the worker rank (rank 1 of 4)",
        "Start the head rank",
    ]


def test_a_cable_pulled_from_a_serving_ring_is_refused_naming_the_cable(monkeypatch, tmp_path):
    """Item 4 of the issue: the cable from spark-b's port 0 to spark-c's port 1 pulled under a
    serving ring of four: both functions lose carrier and their don't-fragment pings. A ring with
    one cable gone is a line, which the ring's engine (its relays, its graph files) cannot run
    on: the run refuses before any change, naming the cable, and restarts nothing."""
    cut = {"spark-b": "enp1s0f0np0,enP2p1s0f0np0", "spark-c": "enp1s0f1np1,enP2p1s0f1np1"}
    converged_ring(monkeypatch, tmp_path, 4)
    for short, rank in (("spark-b", 1), ("spark-c", 2)):
        lines = []
        for dev, _, ip, _ in ringfakes.plan(4, rank):
            pulled = dev in cut[short].split(",")
            lines += [f"df {dev} {int(pulled)}", f"link {dev} 0x1003 {int(not pulled)} 9000",
                      f"addr {dev} {ip}/24"]  # fmt: skip
        fakehosts.inject(short, {ringfakes.LINKS: [*lines, END]})
    r = ring_run(monkeypatch, tmp_path, 4)
    assert r.exit_code != 0
    assert "cable 1 (@fake/spark-b port 0 to @fake/spark-c port 1)" in r.output, r.output
    assert all(r.uploads.get(n, {}) == {} for n in names(4))
    assert rank_restarts(r, 4) == []


@pytest.mark.parametrize("nnodes", [3, 4])
def test_after_the_rings_smoke_test_each_cable_is_smoke_tested_alone(monkeypatch, tmp_path, nnodes):
    """Issue 36 item 2, the busbw of every link: after the all-rank smoke test, each cable's two
    ends run the pair's smoke test over that cable's two functions alone (WORLD_SIZE 2, its
    devices only, the rendezvous on its port-0 end's primary address), one cable after the
    other, the floor the pair's over both functions. The addresses are ringfakes' (the rule)."""
    r = ring_run(monkeypatch, tmp_path, nnodes)
    assert r.exit_code == 0, r.output
    runs = []  # (cable by its port-0 end's address, host, command) in the run's order
    for name in names(nnodes):
        for c in r.commands[name]:
            if "--name sparkrig-nccl-smoke" in c and "WORLD_SIZE=2" in c:
                runs.append((re.search(r"MASTER_ADDR=(\S+)", c)[1], name, c))
    for cable in range(nnodes):
        a, b = cable, (cable + 1) % nnodes  # port 0 of rank a, port 1 of rank b
        master = ringfakes.address(nnodes, a, 0, 0)
        (_, a_host, a_run), (_, b_host, b_run) = sorted(
            [x for x in runs if x[0] == master], key=lambda x: "--detach" in x[2]
        )
        assert (a_host, b_host) == (names(nnodes)[a], names(nnodes)[b])
        assert "--rm " in a_run and "RANK=0" in a_run and "RANK=1" in b_run
        for command, port in ((a_run, 0), (b_run, 1)):
            hca = ",".join(f"{ringfakes.rdma(port, f)}:1" for f in (0, 1))
            assert f" --env NCCL_IB_HCA=={hca} " in command, command
            assert f" --env NCCL_SOCKET_IFNAME=={ringfakes.netdev(port, 0)} " in command, command
            # the pair's env, no graph files
            assert "--env-file" not in command and ".xml:" not in command
            assert "--min-busbw-gbs 16" in command
    # one cable after the other, each after the all-rank test
    order = [op.split(" | ")[-1] for op in r.op_order if op.startswith("tasks/smoke.py")]
    first = order.index("Check the NCCL smoke test on the workers")
    links = [i for i, op in enumerate(order) if "over one cable" in op]
    assert len(links) == 3 * nnodes and min(links) > first


def test_names_sysfs_does_not_show_are_refused_before_any_address_naming_the_port(
    monkeypatch, tmp_path
):
    """Issue 36 item 1: the inventory's port names (or DGX OS's) against what the host's sysfs
    shows (RDMA device, PCI function, netdev, the twin on another domain): spark-b's port 1 twin
    has another RDMA device there; the fabric phase refuses before any address is set (the host
    phase before it has run), naming port and names."""
    lines = [
        x.replace("roceP2p1s0f1", "mlx5_3") if "enP2p1s0f1np1" in x else x
        for x in ringfakes.sysfs_ports()
    ]
    fakehosts.inject("spark-b", {ringfakes.SYSFS_PORTS: lines})
    r = ring_run(monkeypatch, tmp_path, 3)
    assert r.exit_code != 0
    assert (
        "port 1 twin: the inventory says enP2p1s0f1np1 (roceP2p1s0f1), the host has "
        "enP2p1s0f1np1 (mlx5_3): fix fabric_ports"
    ) in r.output
    for name in names(3):  # no fabric netdev configured anywhere
        assert "/etc/netplan/60-sparkrig-fabric.yaml" not in r.uploads.get(name, {}), name
        assert not [c for c in r.commands[name] if c.startswith(("nmcli", "ip addr add"))]


def test_a_host_whose_sysfs_shows_no_twinned_port_is_not_checked_and_says_so(monkeypatch, tmp_path):
    """Soft-RoCE (the lab) or a driver not loaded: no RDMA device on a PCI function with a
    twin. The names are not checked against the host, and the run says so."""
    for short in ("spark-a", "spark-b", "spark-c"):
        fakehosts.inject(short, {ringfakes.SYSFS_PORTS: [END]})
    r = ring_run(monkeypatch, tmp_path, 3, dry=True)
    assert r.exit_code == 0, r.output
    assert "port discovery: no RDMA device on a PCI function with a PCIe twin" in r.output


def test_a_stray_fabric_address_on_one_function_of_a_triangle_is_removed_by_name(
    monkeypatch, tmp_path
):
    """Issue 47 on a triangle: spark-b's first function holds another address of the fabric's
    range before the plan's; it alone is deleted, that netdev's profile applied again, the ring
    restarted in order; no other rank's address is touched."""
    converged_ring(monkeypatch, tmp_path, 3)
    dev, _, ip, _ = ringfakes.plan(3, 1)[0]
    stray = ip.rsplit(".", 1)[0] + ".222/24"
    lines = ringfakes.links(3, 1, addressed=True, mtu=9000)
    first = lines.index(f"addr {dev} {ip}/24")
    fakehosts.inject("spark-b", {ringfakes.LINKS: [*lines[:first], f"addr {dev} {stray}",
                                                   *lines[first:]]})  # fmt: skip
    r = ring_run(monkeypatch, tmp_path, 3)
    assert r.exit_code == 0, r.output
    deleted = [c for name in names(3) for c in r.commands[name] if "ip -4 addr del" in c]
    assert len(deleted) == 1 and f"ip -4 addr del {stray} dev {dev}" in deleted[0], deleted
    assert deleted[0] in r.commands["@fake/spark-b"]
    assert f"{dev}: removing {stray}" in r.output
    assert f"nmcli --wait 90 connection up netplan-{dev}" in r.commands["@fake/spark-b"]
    assert started_in_order(r) == [
        "Start the worker rank (rank 2 of 3)",
        "Start the worker rank (rank 1 of 3)",
        "Start the head rank",
    ]
