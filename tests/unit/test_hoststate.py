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
from pyinfra.facts.systemd import SystemdStatus

from sparkrig.hoststate import Part, assemble, script, split_script
from sparkrig.owned import OwnedDir, OwnedFile, PathState


def run_script(parts: tuple[Part, ...]) -> list[str]:
    out = subprocess.run(["sh", "-c", script(parts)], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_one_script_reads_files_dirs_and_absent_paths(tmp_path):
    owned = tmp_path / "sparkrig.conf"
    owned.write_text("vm.swappiness = 0\n")
    owned.chmod(0o600)
    gone = tmp_path / "absent"
    parts = (
        Part(f"file:{owned}", OwnedFile, (("path", str(owned)),)),
        Part(f"file:{gone}", OwnedFile, (("path", str(gone)),)),
        Part(f"dir:{tmp_path}", OwnedDir, (("path", str(tmp_path)),)),
        Part(f"dir:{gone}", OwnedDir, (("path", str(gone)),)),
        Part(f"file:{tmp_path}", OwnedFile, (("path", str(tmp_path)),)),  # a dir where a file is
    )
    report = assemble(parts, run_script(parts))
    me = pwd.getpwuid(os.getuid()).pw_name
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    sha = hashlib.sha256(b"vm.swappiness = 0\n").hexdigest()
    assert report.file(str(owned)) == PathState("file", 600, me, group, sha)
    assert report.file(str(gone)) is None
    assert report.file(str(tmp_path)) == PathState("other")
    mode = int(oct(tmp_path.stat().st_mode & 0o777)[2:])
    assert report.dir(str(tmp_path)) == PathState("dir", mode, me, group)
    assert report.dir(str(gone)) is None
    with pytest.raises(KeyError, match="not in the state read"):
        report.file("/etc/elsewhere")


def test_the_fakes_see_each_part_as_the_command_it_is():
    parts = (
        Part("file:/etc/a b", OwnedFile, (("path", "/etc/a b"),)),
        Part("running:x.service", SystemdStatus, (("services", ("x.service",)),)),
    )
    split = list(split_script(script(parts)))
    assert split == [(p.key, p.command()) for p in parts]
    assert split[1][1].startswith("if command -v systemctl >/dev/null 2>&1; then ( systemctl show")


def test_a_failing_or_cut_read_fails_its_host_naming_the_part(tmp_path):
    x = str(tmp_path / "x")
    parts = (Part("file:x", OwnedFile, (("path", x),)),)
    lines = run_script(parts)
    assert assemble(parts, lines).file("x") is None
    failed = [line.replace("##SPARKRIG-RC 0", "##SPARKRIG-RC 2") for line in lines]
    with pytest.raises(FactProcessError, match="file:x failed"):
        assemble(parts, failed)
    with pytest.raises(FactProcessError, match="no end marker"):
        assemble(parts, lines[:-1])
    with pytest.raises(FactProcessError, match="unexpected line"):
        assemble(parts, [lines[0], "file 6x4 root", *lines[1:]])
