"""The RoCE GID fact's parser and selection on recorded sysfs layouts."""

from __future__ import annotations

from hashlib import sha256
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError
from sparkhost.gid import GidNotFound, ipv4_mapped_gid, select_gid

from sparkrig.fabric import moved_gid_index
from sparkrig.fabricfacts import RoceGids

DATA = Path(__file__).parent / "data"


def table(name: str):
    return RoceGids().process((DATA / name).read_text().splitlines())


def test_rxe_layout_lists_roce_v2_only_and_ipv4_at_index_1():
    entries = table("gids_rxe.txt")
    assert [(e.index, e.type) for e in entries] == [(0, "RoCE v2"), (1, "RoCE v2")]
    chosen = select_gid(entries, "10.200.0.2", "enp1s0f1np1")
    assert (chosen.device, chosen.index) == ("rxe0", 1)


def test_cx7_layout_picks_roce_v2_ipv4_on_the_cabled_function_not_index_3():
    entries = table("gids_cx7.txt")
    assert {e.device for e in entries} == {"rocep1s0f0", "rocep1s0f1", "roceP2p1s0f1"}
    chosen = select_gid(entries, "192.168.100.10", "enp1s0f1np1")
    assert (chosen.device, chosen.index, chosen.type) == ("rocep1s0f1", 5, "RoCE v2")
    second_rail = select_gid(entries, "192.168.101.10", "enP2p1s0f1np1")
    assert (second_rail.device, second_rail.index) == ("roceP2p1s0f1", 3)


def test_explicit_device_restricts_the_search():
    entries = table("gids_cx7.txt")
    with pytest.raises(GidNotFound):
        select_gid(entries, "192.168.100.10", "enp1s0f1np1", device="rocep1s0f0")


def test_no_match_fails_with_the_table_printed():
    with pytest.raises(GidNotFound) as err:
        select_gid(table("gids_cx7.txt"), "192.168.100.99", "enp1s0f1np1")
    text = str(err.value)
    assert "::ffff:192.168.100.99" in text
    assert "rocep1s0f1        1     5  0000:0000:0000:0000:0000:ffff:c0a8:640a  RoCE v2" in text


def test_zero_entries_are_skipped_and_empty_output_means_no_device():
    assert RoceGids().process(["##SPARKRIG-END##"]) == []
    assert all(e.gid != "0000:0000:0000:0000:0000:0000:0000:0000" for e in table("gids_cx7.txt"))


def test_garbage_fails_only_this_host():
    with pytest.raises(FactProcessError):
        RoceGids().process(["Permission denied"])


def test_ipv4_mapped_gid_spelling():
    assert ipv4_mapped_gid("192.168.100.10") == "0000:0000:0000:0000:0000:ffff:c0a8:640a"


@pytest.mark.parametrize(
    ("name", "ip", "netdev", "device"),
    [
        ("gids_cx7.txt", "192.168.100.10", "enp1s0f1np1", "rocep1s0f1"),
        ("gids_cx7.txt", "192.168.101.10", "enP2p1s0f1np1", "roceP2p1s0f1"),
        ("gids_rxe.txt", "10.200.0.2", "enp1s0f1np1", "rxe0"),
    ],
)
def test_the_start_gate_reads_sysfs_and_picks_what_the_deploy_picks(
    tmp_path, monkeypatch, name, ip, netdev, device
):
    """One table, one rule: the same recorded GID table laid out as sysfs files gives the start
    gate (sparkhost prep, at every start) the entry the deploy's fact selects (rank.env)."""
    from sparkhost import prep
    from sparkhost.gid import read_table

    lines = (DATA / name).read_text().splitlines()
    for line in lines:
        path, _, value = line.partition(":")
        f = tmp_path / path.removeprefix("/sys/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(value + "\n")
    deployed = select_gid(table(name), ip, netdev)
    assert read_table(str(tmp_path), device, 1) == [e for e in table(name) if e.device == device]
    monkeypatch.setattr(prep, "SYS", str(tmp_path))
    assert prep.find_gid(device, "1", ip, netdev) == deployed.index
    assert prep.find_gid(device, "1", "192.168.100.99", netdev) is None


def test_an_env_file_that_differs_only_in_its_gid_index_names_the_old_index():
    text = "NCCL_IB_HCA=rxe0\nNCCL_IB_GID_INDEX=1\nNCCL_DEBUG=WARN\n"

    def on_host(t: str) -> str:
        return sha256(t.encode()).hexdigest()

    assert moved_gid_index(text, "1", on_host(text.replace("INDEX=1", "INDEX=3"))) == 3
    assert moved_gid_index(text, "1", on_host(text)) is None  # nothing moved
    other = text.replace("INDEX=1", "INDEX=3").replace("WARN", "INFO")
    assert moved_gid_index(text, "1", on_host(other)) is None  # more than the index changed
    assert moved_gid_index(text, "1", None) is None  # no file yet
