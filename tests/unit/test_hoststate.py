"""The state read's script run by a real shell (the plan tests' fakes answer it part by part, so
only this proves the composed script runs and parses): owned files and directories with mode,
owner and sha256, absent paths, a part whose binary is missing, a failing part, a cut output."""

from __future__ import annotations

import hashlib
import os
import pwd
import subprocess

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig.hoststate import assemble
from sparkrig.owned import OwnedPaths, PathState, UnitStates
from sparkrig.runningrank import RankRuntime, RankRuntimeReport
from sparkrig.stateread import Part, script, split_script


def run_script(parts: tuple[Part, ...]) -> list[str]:
    out = subprocess.run(["sh", "-c", script(parts)], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def owned(files: list[str], dirs: list[str]) -> Part:
    return Part("paths", OwnedPaths, (("dirs", tuple(dirs)), ("files", tuple(files))))


def test_one_part_reads_every_owned_file_and_dir_with_absent_and_wrong_kinds(tmp_path):
    conf = tmp_path / "sparkrig.conf"
    conf.write_text("vm.swappiness = 0\n")
    conf.chmod(0o600)
    spaced = tmp_path / "a b.env"  # a space in a path survives stat's %n and sha256sum's line
    spaced.write_text("X=1\n")
    link = tmp_path / "link"
    link.symlink_to(conf)
    gone = tmp_path / "absent"
    files = [str(conf), str(spaced), str(gone), str(tmp_path), str(link)]  # a dir where a file is
    dirs = [str(tmp_path), str(gone), str(conf)]  # a file where a dir is
    parts = (owned(files, dirs),)
    report = assemble(parts, run_script(parts))
    me = pwd.getpwuid(os.getuid()).pw_name
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    sha = hashlib.sha256(b"vm.swappiness = 0\n").hexdigest()
    assert report.file(str(conf)) == PathState("file", 600, me, group, sha)
    assert report.file(str(spaced)).sha256 == hashlib.sha256(b"X=1\n").hexdigest()
    assert report.file(str(gone)) is None
    assert report.file(str(tmp_path)) == PathState("other")
    assert report.file(str(link)) == PathState("link")
    mode = int(oct(tmp_path.stat().st_mode & 0o777)[2:])
    assert report.dir(str(tmp_path)) == PathState("dir", mode, me, group)
    assert report.dir(str(gone)) is None
    assert report.dir(str(conf)) == PathState("other")
    with pytest.raises(KeyError, match="not in the state read"):
        report.file("/etc/elsewhere")


def test_owned_paths_cost_three_processes_whatever_their_number(tmp_path):
    """The point of the batch: stat (dirs), stat and sha256sum (files) run once each."""
    paths = []
    for n in range(12):
        (tmp_path / str(n)).write_text(str(n))
        paths.append(str(tmp_path / str(n)))
    command = OwnedPaths().command(files=tuple(paths), dirs=(str(tmp_path),))
    for tool in ("stat", "sha256sum"):
        assert command.count(f"{tool} ") == (2 if tool == "stat" else 1), command
    parts = (owned(paths, [str(tmp_path)]),)
    report = assemble(parts, run_script(parts))
    assert [report.file(p).sha256 for p in paths] == [
        hashlib.sha256(str(n).encode()).hexdigest() for n in range(12)
    ]


def test_unit_states_read_every_unit_in_one_systemctl_show():
    """pyinfra's own running and enabled states; a unit systemd does not know is neither."""
    fact = UnitStates()
    assert fact.command(units=("a.service", "b.service")).count("systemctl ") == 1
    lines = [
        "Id=a.service", "SubState=running", "UnitFileState=enabled", "",
        "Id=b.service", "SubState=exited", "UnitFileState=disabled", "",
        "Id=c.service", "SubState=dead", "UnitFileState=static", "",
        "Id=d.service", "SubState=start-pre", "UnitFileState=enabled",
    ]  # fmt: skip
    assert fact.process(lines) == {
        "a.service": (True, True, False),
        "b.service": (True, False, False),
        "c.service": (False, True, True),
        "d.service": (False, True, False),  # in its start gate: not running, not down either
    }
    parts = (Part("units", UnitStates, (("units", ("a.service", "gone.service")),)),)
    out = ["##SPARKRIG-PART units", *lines[:4], "##SPARKRIG-RC 0", "##SPARKRIG-END##"]
    report = assemble(parts, out)
    assert report.unit("a") == (True, True)
    assert report.unit("gone.service") == (False, False)
    assert not report.owned.is_down("a") and report.owned.is_down("gone")
    with pytest.raises(KeyError, match="not in the state read"):
        report.unit("c")


def test_the_fakes_see_each_part_as_the_command_it_is():
    parts = (
        owned(["/etc/a b"], ["/etc"]),
        Part("units", UnitStates, (("units", ("x.service",)),)),
    )
    split = list(split_script(script(parts)))
    assert split == [(p.key, p.command()) for p in parts]
    assert split[1][1].startswith("if command -v systemctl >/dev/null 2>&1; then ( systemctl show")


def test_a_failing_or_cut_read_fails_its_host_naming_the_part(tmp_path):
    x = str(tmp_path / "x")
    parts = (owned([x], []),)
    lines = run_script(parts)
    assert assemble(parts, lines).file(x) is None
    failed = [line.replace("##SPARKRIG-RC 0", "##SPARKRIG-RC 2") for line in lines]
    with pytest.raises(FactProcessError, match="paths failed"):
        assemble(parts, failed)
    with pytest.raises(FactProcessError, match="no end marker"):
        assemble(parts, lines[:-1])
    with pytest.raises(FactProcessError, match="unexpected line"):
        assemble(parts, [lines[0], "files:", f"file 6x4 root root {x}", *lines[1:]])
    with pytest.raises(FactProcessError, match="nothing said of"):
        assemble(parts, [line for line in lines if not line.startswith("none ")])


def test_the_rank_part_reads_the_containers_state_and_the_handed_gid_index(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"  # answers as `docker inspect --format '{{.State.Status}}' c`
    docker.write_text('#!/bin/sh\n[ "$4" = sparkrig-rank1 ] && echo paused || exit 1\n')
    docker.chmod(0o755)
    rdma = bin_dir / "rdma"  # as iproute2's `rdma dev show rxe0` after the device was made again
    rdma.write_text(  # rxe1 is gone
        '#!/bin/sh\n[ "$3" = rxe0 ] && echo "9: rxe0: node_type ca protocol roce" || exit 1\n'
    )
    rdma.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    handed = tmp_path / "gid.env"
    handed.write_text(
        "# written at the start\nSPARKRIG_GID_INDEX=3\nSPARKRIG_ROCE_DEVICE=rxe0\n"
        "SPARKRIG_ROCE_DEVICE_INDEX=2\n"
    )
    rank = Part(
        "rank", RankRuntime, (("container", "sparkrig-rank1"), ("handed_path", str(handed)))
    )
    values = assemble((rank,), run_script((rank,))).values
    assert values.get("rank", RankRuntime) == RankRuntimeReport(
        container="paused", handed_gid=3, handed_device_index=2, live_device_index=9
    )

    # fabric_layout "ports": every device's GID and kernel index at the start, and each one now
    handed.write_text(
        "SPARKRIG_GID_INDEX=3\nSPARKRIG_GID_INDEXES=rxe0:3,rxe1:5\n"
        "SPARKRIG_ROCE_DEVICE_INDEXES=rxe0:2,rxe1:4\n"
    )
    report = assemble((rank,), run_script((rank,))).values.get("rank", RankRuntime)
    assert report.handed_gids == {"rxe0": 3, "rxe1": 5}
    assert report.handed_device_indexes == {"rxe0": 2, "rxe1": 4}
    assert report.live_device_indexes == {"rxe0": 9}  # rxe1 gone

    handed.unlink()  # a reboot cleared /run; no container of that name
    gone = Part("rank", RankRuntime, (("container", "other"), ("handed_path", str(handed))))
    values = assemble((gone,), run_script((gone,))).values
    assert values.get("rank", RankRuntime) == RankRuntimeReport(container="", handed_gid=None)
