"""Every file format the host and the control side share, fed from its real writer to every
reader: the rank's env file (templates/rank.env.j2), the start gate's GID hand-over file
(sparkhost prep) and the installed lockfiles' paths. The release record's writer and reader
(sparkrig/release.py) meet in tests/unit/test_release.py, through the state read's real shell.

The status read and the rank unit are read here as they read on a host: status's own remote
command run by a real shell on the written files; the unit's EnvironmentFile= lines and its
``--env NCCL_IB_GID_INDEX=${...}`` expanded the way systemd does."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

from sparkhost import lockfile, prep, rankenv

from sparkrig.config.inventory import build
from sparkrig.config.model import Settings
from sparkrig.fabric import env_context, moved_gid_index
from sparkrig.paths import paths
from sparkrig.release import release_files
from sparkrig.render import render
from sparkrig.serving import rank_unit_context, weights_id
from sparkrig.status import RankStatus, fact_args, problems
from tests.unit.conftest import cluster


def settings(**knobs) -> Settings:
    return build(cluster(2, **knobs))["spark-1"]


def rank_env(s: Settings, gid_index: int) -> str:
    """The rank env file as the deploy writes it (sparkrig.fabric.rank_env_written)."""
    return render("rank.env.j2", **env_context(s), hca="rocep1s0f1", gid_index=str(gid_index))


def rank_unit(s: Settings) -> str:
    context = rank_unit_context(s, s.image_ref, weights_id(s))
    return render("sparkrig-rank.service.j2", **context)


def status_read(s: Settings, env_file: Path, gid_file: Path, run_dir: Path):
    """status.py's one read of a rank, by a real shell on these files."""
    fact = RankStatus()
    command = fact.command(**fact_args(s, str(env_file), str(gid_file), str(run_dir)))
    out = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=60
    )
    return fact.process(out.stdout.splitlines())


def systemd_env(unit: str, files: dict[str, Path]) -> dict[str, str]:
    """The environment the unit's EnvironmentFile= lines give (``-``: may be missing), with
    each unit path mapped to the file that stands in for it here."""
    env: dict[str, str] = {}
    for line in unit.splitlines():
        if line.startswith("EnvironmentFile="):
            path = line.removeprefix("EnvironmentFile=")
            optional = path.startswith("-")
            local = files[path.removeprefix("-")]
            if local.exists() or not optional:
                env.update(rankenv.parse(local.read_text()))
    return env


def container_gid_index(unit: str, env: dict[str, str]) -> str:
    """The NCCL_IB_GID_INDEX the unit's ``docker run --env`` gives the container."""
    m = re.search(r"--env NCCL_IB_GID_INDEX=\$\{(\w+)\}", unit)
    assert m, "the rank unit hands no GID index to the container"
    return env.get(m.group(1), "")


def test_the_gid_index_the_start_gate_hands_over_reaches_the_container_and_status(tmp_path):
    s = settings()
    p = paths(s)
    env_file, gid_file = tmp_path / "rank.env", tmp_path / "run" / "gid.env"
    text = rank_env(s, gid_index=3)
    env_file.write_text(text)
    prep.hand_over_gid(rankenv.rank_env(rankenv.parse(text)), 7, str(gid_file))  # it moved

    unit = rank_unit(s)
    files = {p.env_file: env_file, p.gid_env: gid_file}
    assert container_gid_index(unit, systemd_env(unit, files)) == "7"
    assert rankenv.read_handed(str(gid_file)) == 7

    st = status_read(s, env_file, gid_file, tmp_path / "run")
    assert (st.gid_env, st.gid_handed) == (3, 7)


def test_the_start_gate_hands_over_the_rdma_devices_kernel_index(tmp_path, monkeypatch):
    rdma = tmp_path / "bin" / "rdma"  # iproute2's `rdma dev show <dev>`
    rdma.parent.mkdir()
    rdma.write_text('#!/bin/sh\necho "7: $3: node_type ca protocol roce node_guid 5054:00ff"\n')
    rdma.chmod(0o755)
    monkeypatch.setenv("PATH", f"{rdma.parent}:{os.environ['PATH']}")
    gid_file = tmp_path / "gid.env"
    env = rankenv.rank_env(rankenv.parse(rank_env(settings(), gid_index=3)))
    prep.hand_over_gid(env, 3, str(gid_file))
    handed = rankenv.parse(gid_file.read_text())
    assert handed[rankenv.HANDED_DEVICE] == env.hca  # the device the env file names
    assert handed[rankenv.HANDED_DEVICE_INDEX] == "7"
    assert rankenv.read_handed(str(gid_file)) == 3
    env_file = tmp_path / "rank.env"
    env_file.write_text(rank_env(settings(), gid_index=3))
    st = status_read(settings(), env_file, gid_file, tmp_path)
    assert (st.gid_device_handed, st.gid_device_live) == (7, 7)
    assert not [p for p in problems(settings(), st, st.image) if "RDMA device" in p]
    rdma.write_text('#!/bin/sh\necho "8: $3: node_type ca protocol roce"\n')  # made again
    st = status_read(settings(), env_file, gid_file, tmp_path)
    said = [p for p in problems(settings(), st, st.image) if "RDMA device" in p]
    assert said == ["RDMA device made again under the rank (kernel index 7 at its start, 8 now)"]

    rdma.unlink()  # no iproute2 rdma: the index alone, as before
    prep.hand_over_gid(env, 3, str(gid_file))
    assert rankenv.HANDED_DEVICE_INDEX not in rankenv.parse(gid_file.read_text())


def test_without_a_handed_over_index_the_container_gets_none_and_status_shows_none(tmp_path):
    s = settings()
    p = paths(s)
    env_file, gid_file = tmp_path / "rank.env", tmp_path / "gid.env"
    env_file.write_text(rank_env(s, gid_index=3))
    unit = rank_unit(s)
    env = systemd_env(unit, {p.env_file: env_file, p.gid_env: gid_file})
    assert container_gid_index(unit, env) == ""  # the start gate refused: the rank never starts
    assert rankenv.read_handed(str(gid_file)) is None
    st = status_read(s, env_file, gid_file, tmp_path)
    assert (st.gid_env, st.gid_handed) == (3, None)


def test_the_rank_env_file_reads_the_same_everywhere(tmp_path):
    s = settings(nccl_env={"NCCL_DEBUG_SUBSYS": "INIT"})
    text = rank_env(s, gid_index=5)
    env_file = tmp_path / "rank.env"
    env_file.write_text(text)
    env = rankenv.read(str(env_file))  # the start gate's reader (prep --env)
    assert env[rankenv.GID_INDEX] == "5" and env["NCCL_DEBUG_SUBSYS"] == "INIT"
    view = rankenv.read_rank_env(str(env_file))  # what prep's fabric checks read, typed
    assert (view.interface, view.ip, view.mtu) == (s.me.fabric_interface, s.me.ip, 9000)
    assert (view.roce_port, view.hca, view.gid_index) == (s.knobs.roce_port, "rocep1s0f1", 5)
    assert not view.ports and view.netdevs == ()
    assert status_read(s, env_file, tmp_path / "gid.env", tmp_path).gid_env == 5
    # the deploy's own reader: a file that differs only in its index names the old index
    old = hashlib.sha256(text.encode()).hexdigest()
    assert moved_gid_index(rank_env(s, gid_index=9), "9", old) == 5
    unit = rank_unit(s)  # the unit and its start gate read the file the deploy writes
    assert f"EnvironmentFile={paths(s).env_file}\n" in unit
    assert f" prep --env {paths(s).env_file} " in unit


def test_every_installed_lockfile_path_is_the_lockfile_modules():
    s = settings()
    model = lockfile.installed_path(s.knobs.config_dir, "model")
    assert model == "/etc/sparkrig/model.lock.json"
    assert fact_args(s, "", "", "")["lock"] == model  # status reads the installed lockfile
    assert model in release_files(s)  # an upgrade keeps it as .prev
