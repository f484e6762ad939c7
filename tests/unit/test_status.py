"""sparkrig.status: the rank report is typed and a cut or garbled one fails its host."""

from __future__ import annotations

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig.config.inventory import build
from sparkrig.factlines import END
from sparkrig.image import serving_image
from sparkrig.status import RankState, live_gid_index, parse_rank_state, problems
from tests.unit.conftest import DIGEST, cluster

GOOD = "unit_ActiveState=active unit_SubState=running image=r:t gid_env=3 mtu=9000 \
memfree_kb=100 weights_commit=ab weights_verified=5".split()


def gid_lines(ip: str, netdev: str, index: int, kind: str = "RoCE v2", dev: str = "rxe0"):
    """One GID entry as the status read prints it (sparkrig.fabric.gid_table_command)."""
    a, b, c, d = (int(x) for x in ip.split("."))
    base = f"/sys/class/infiniband/{dev}/ports/1"
    gid = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
    return [
        f"{base}/gids/{index}:{gid}",
        f"{base}/gid_attrs/types/{index}:{kind}",
        f"{base}/gid_attrs/ndevs/{index}:{netdev}",
    ]


def test_a_report_parses_typed():
    st = parse_rank_state([*GOOD, *gid_lines("192.168.100.11", "enp1s0f1np1", 3), END])
    assert st.gid_env == 3 and st.gid_handed is None and st.mtu == 9000 and st.active == "active"
    assert [(e.index, e.type, e.netdev) for e in st.gids] == [(3, "RoCE v2", "enp1s0f1np1")]


GARBLED_GID = "/sys/class/infiniband/rxe0/ports/1/gids/x:0000"


@pytest.mark.parametrize("lines", [GOOD, [*GOOD, "mtu=lots", END], [*GOOD, GARBLED_GID, END]])
def test_a_cut_or_garbled_report_fails_its_host(lines):
    with pytest.raises(FactProcessError):
        parse_rank_state(lines)


def test_the_live_index_is_picked_by_the_start_gates_rule():
    """The same address's GID as RoCE v1, and as RoCE v2 on another netdev (a VLAN on the
    fabric port), sit at lower indexes than the fabric NIC's RoCE v2 entry: only the latter
    counts, as in sparkhost.gid.select_gid (the start gate) and the deploy's GID fact."""
    s = build(cluster(2))["spark-1"]
    ip, nic = s.me.ip, s.me.fabric_interface
    table = [
        *gid_lines(ip, nic, 1, kind="IB/RoCE v1"),
        *gid_lines(ip, "vlan7", 2),
        *gid_lines(ip, nic, 5),
    ]
    st = parse_rank_state([*GOOD, *table, END])
    assert live_gid_index(s, st) == 5
    assert "GID index: env file 3, live table 5" in problems(s, st, "r:t")
    gone = parse_rank_state([*GOOD, *gid_lines(ip, "vlan7", 2), END])
    assert live_gid_index(s, gone) is None


def test_a_handed_over_gid_that_left_the_table_is_off():
    s = build(cluster(2))["spark-1"]
    k = s.knobs
    table = tuple(parse_rank_state([*gid_lines(s.me.ip, s.me.fabric_interface, 3), END]).gids)
    commit = s.model.revision
    fine = RankState("active", "running", "", "img", 3, table, 3, k.fabric_mtu, 0, commit)
    assert problems(s, fine, "img") == []
    moved = RankState("active", "running", "", "img", 3, table, 4, k.fabric_mtu, 0, commit)
    assert problems(s, moved, "img") == ["GID index: start gate handed over 4, live table 3"]


def ports_state(s, **over):
    """A serving rank of a ports-layout pair as the status read prints it: both functions' GIDs
    in the table, handed over as they are, every netdev at MTU 9000 (``over`` replaces lines)."""
    part = s.fabric_rank
    table = [line for n, i in enumerate(part.ifaces)
             for line in gid_lines(str(i.address.ip), i.netdev, 3 + 2 * n, dev=i.rdma)]  # fmt: skip
    fields = {
        "gids_handed": ",".join(f"{i.rdma}:{3 + 2 * n}" for n, i in enumerate(part.ifaces)),
        "devices_handed": ",".join(f"{i.rdma}:{4 + n}" for n, i in enumerate(part.ifaces)),
        "devices_live": ",".join(f"{i.rdma}:{4 + n}" for n, i in enumerate(part.ifaces)),
        "mtus": ",".join(f"{i.netdev}:9000" for i in part.ifaces),
        **over,
    }
    good = [x for x in GOOD if not x.startswith(("gid_env=", "weights_commit="))]
    good.append(f"weights_commit={s.model.revision}")  # (the ports env pins no GID index)
    return parse_rank_state([*good, *(f"{k}={v}" for k, v in fields.items()), *table, END])


def test_a_ports_pair_rank_is_judged_per_function():
    from tests.unit.test_rings import ports_cluster

    s = build(ports_cluster(2))["spark-1"]
    assert problems(s, ports_state(s), "r:t") == []  # no env-file index is not a problem there
    twin = s.fabric_rank.ifaces[1]
    moved = ports_state(s, gids_handed=f"rocep1s0f1:3,{twin.rdma}:9")
    assert problems(s, moved, "r:t") == [
        f"{twin.rdma}: GID index: start gate handed over 9, live table 5"
    ]
    gone = ports_state(s, devices_live="rocep1s0f1:4")
    assert problems(s, gone, "r:t") == [
        f"{twin.rdma}: RDMA device made again under the rank (kernel index 5 at its start, "
        "gone now)"
    ]
    mtu = ports_state(s, mtus=f"enp1s0f1np1:9000,{twin.netdev}:1500")
    assert problems(s, mtu, "r:t") == [f"MTU 1500 on {twin.netdev}, want 9000"]


def serving_state(s, **over: str) -> RankState:
    """A rank serving exactly as the deploy leaves it (the image it would run, the lockfile's
    weights, its GID in the table and the env file, the fabric MTU); ``over`` replaces lines."""
    fields = {
        "unit_ActiveState": "active",
        "unit_SubState": "running",
        "image": serving_image(s),
        "gid_env": "3",
        "mtu": str(s.knobs.fabric_mtu),
        "memfree_kb": "100",
        "weights_commit": s.model.revision,
        "weights_verified": "5",
        **over,
    }
    table = gid_lines(s.me.ip, s.me.fabric_interface, 3)
    return parse_rank_state([*(f"{k}={v}" for k, v in fields.items()), *table, END])


def test_a_rank_running_another_images_digest_is_off():
    """The image the rank's container runs against the one the deploy would run: one built from
    another base digest (another release's pin), or none at all, is named, and only it."""
    s = build(cluster(2))["spark-1"]
    want = serving_image(s)
    assert problems(s, serving_state(s), want) == []
    other = serving_image(
        build(cluster(2, base_image=DIGEST.replace("ab" * 32, "cd" * 32)))["spark-1"]
    )
    assert other != want  # the tag follows the pinned digest
    assert problems(s, serving_state(s, image=other), want) == [
        f"runs image {other}, the deploy would run {want}"
    ]
    assert problems(s, serving_state(s, image=""), want) == [
        f"runs image none, the deploy would run {want}"
    ]


def test_a_rank_serving_other_weights_is_off():
    """The weights' commit in the rank's installed lockfile against the revision the release
    pins: another commit, or no lockfile (absent), is named, and only it."""
    s = build(cluster(2))["spark-1"]
    want, other = s.model.revision, "0" * 40
    assert other != want
    assert problems(s, serving_state(s, weights_commit=other), serving_image(s)) == [
        f"weights {other}, want {want}"
    ]
    assert problems(s, serving_state(s, weights_commit=""), serving_image(s)) == [
        f"weights absent, want {want}"
    ]


def test_a_ports_pair_ranks_line_names_each_function_and_its_figure_alone():
    from sparkrig.status import line
    from tests.unit.test_rings import ports_cluster

    s = build(ports_cluster(2))["spark-1"]
    kept = (("busbw_gbs", 21.4), ("function.rocep1s0f1", 11.9), ("function.roceP2p1s0f1", 12.0))
    st = ports_state(s, mtus="enp1s0f1np1:9000,enP2p1s0f1np1:1500")
    text = line(s, RankState(**{**st.__dict__, "fabric": kept}), "0.1 h ago")
    assert "fabric rocep1s0f1 gid 3/3 mtu 9000, roceP2p1s0f1 gid 5/5 mtu 1500" in text
    assert "alone: roceP2p1s0f1 12.0, rocep1s0f1 11.9 GB/s" in text
    assert "gid env=" not in text  # the one-netdev fields say nothing of two functions
