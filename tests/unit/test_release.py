"""The release record and the commands that keep, restore, adopt and prune releases, run by a real
shell on files in a temporary directory (the plan tests' fakes only match these commands)."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig.config.inventory import build
from sparkrig.release import (
    LISTING,
    Release,
    ReleaseState,
    change,
    history,
    images_kept,
    parse_record,
    parse_release_state,
    record_text,
)
from sparkrig.revisiondirs import (
    adopt_command,
    prune_weights_command,
    weights_kept,
    weights_to_prune,
)
from sparkrig.rollback import keep_command, restore_command
from tests.unit.conftest import cluster

C1, C2, C3 = "1" * 40, "2" * 40, "3" * 40


def rel(n: int, model: str = C1, profile: str = "shared", files=()) -> Release:
    return Release(f"sparkrig/vllm-glm53:{n:012d}", f"base-{n}", model, "", profile, files)


def sh(script: str, path: str = "") -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{path}:/usr/bin:/bin" if path else "/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the record --------------------------------------------------------------------------------


def test_record_round_trips_and_equal_records_are_equal_bytes():
    releases = (rel(2, C2, files=(("/etc/u", "ab"),)), rel(1))
    text = record_text(releases)
    assert parse_record(text) == releases
    assert record_text(parse_record(text)) == text


@pytest.mark.parametrize(
    "text", ["{", "[]", '{"version": 2, "releases": []}', '{"version": 1, "releases": [{}]}']
)
def test_a_record_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError):
        parse_record(text)


def test_history_puts_the_new_release_first_and_keeps_the_knobs_worth():
    old = (rel(2, C2), rel(1))
    assert history(rel(3, C3), old, 2) == (rel(3, C3), rel(2, C2))
    assert history(rel(3, C3), old, 3) == (rel(3, C3), rel(2, C2), rel(1))
    assert history(rel(3, C3), old, 1) == (rel(3, C3),)
    # a rollback target upgraded to again is not kept twice; new file digests replace the old
    again = rel(1, files=(("/etc/u", "new"),))
    assert history(again, old, 3) == (again, rel(2, C2))


def test_a_release_is_its_image_revisions_and_profile_not_its_file_digests():
    assert rel(1, files=(("/etc/u", "a"),)).identity == rel(1).identity
    assert rel(1, profile="long").identity != rel(1).identity
    assert rel(1, C2).identity != rel(1).identity
    assert rel(2).identity != rel(1).identity


def test_prune_keeps_every_kept_releases_weights_and_images_and_nothing_else_of_ours():
    kept = (rel(2, C2), rel(1, C1))
    entries = [
        ("dir", f"model-{C1}"), ("dir", f"model-{C2}"), ("dir", f"model-{C3}"),
        ("dir", f"drafter-{C3}"), ("file", f"model-{C3}.stamps.json"), ("dir", "model"),
        ("link", f"model-{'4' * 40}"), ("dir", "someone-elses"),
    ]  # fmt: skip
    assert weights_kept(kept) == [f"model-{C1}", f"model-{C2}"]
    assert weights_to_prune(entries, weights_kept(kept)) == [f"drafter-{C3}", f"model-{C3}"]
    assert images_kept(kept) == ["base-1", "base-2", *sorted(r.image for r in kept)]


def test_the_recorded_release_changes_only_when_identity_differs():
    s = build(cluster())["spark-0"]
    from sparkrig.release import ReleaseReport, wanted

    now = wanted(s)
    assert change(s, ReleaseReport()) == ""  # a first install: nothing to roll back to
    assert change(s, ReleaseReport(releases=(now,))) == ""
    moved = s.knobs.model_copy(update={"profile": "long"})
    later = s.model_copy(update={"knobs": moved})
    said = change(later, ReleaseReport(releases=(now,)))
    assert said.endswith("profile long") and "profile shared ->" in said


# --- the state read part, by a real shell --------------------------------------------------------


def test_release_state_reads_the_record_and_the_weights_dir(tmp_path):
    record = tmp_path / "release.json"
    weights = tmp_path / "models"
    (weights / f"model-{C1}").mkdir(parents=True)
    (weights / f"model-{C1}.stamps.json").write_text("{}")
    (weights / "model").symlink_to(f"model-{C1}")
    fact = ReleaseState()
    command = fact.command(str(record), str(weights)).get_raw_value()
    empty = fact.process(sh(command).stdout.splitlines())
    assert empty.releases == () and empty.serving is None and empty.error == ""
    assert set(empty.entries) == {
        ("dir", f"model-{C1}"), ("file", f"model-{C1}.stamps.json"), ("link", "model")
    }  # fmt: skip
    record.write_text(record_text((rel(2, C2), rel(1))))
    held = fact.process(sh(command).stdout.splitlines())
    assert held.serving == rel(2, C2) and held.releases[1] == rel(1)
    record.write_text("{not json")
    assert "unreadable" in fact.process(sh(command).stdout.splitlines()).error
    nothing = fact.process(sh(fact.command(str(record), str(tmp_path / "no")).get_raw_value())
                           .stdout.splitlines())  # fmt: skip
    assert nothing.entries == ()


def test_a_cut_release_state_fails_its_host():
    with pytest.raises(FactProcessError):
        parse_release_state(["{}", LISTING, "dir model-x"])  # no end marker


# --- keep, restore --------------------------------------------------------------------------------


def fake_systemctl(tmp_path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "systemctl"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/systemctl.log\n')
    tool.chmod(0o755)
    return str(bin_dir)


def test_keep_copies_the_recorded_files_and_restore_puts_them_back(tmp_path):
    unit, lock = tmp_path / "rank.service", tmp_path / "model.lock.json"
    unit.write_bytes(b"old unit\n")
    lock.write_bytes(b"old lock\n")
    files = [(str(unit), sha(b"old unit\n")), (str(lock), sha(b"old lock\n"))]
    assert sh(keep_command(files)).returncode == 0
    assert (tmp_path / "rank.service.prev").read_bytes() == b"old unit\n"
    # the upgrade writes the new release; keeping again (a re-run) leaves the copies alone
    unit.write_bytes(b"new unit\n")
    lock.write_bytes(b"new lock\n")
    assert sh(keep_command(files)).returncode == 0
    assert (tmp_path / "model.lock.json.prev").read_bytes() == b"old lock\n"
    path = fake_systemctl(tmp_path)
    done = sh(restore_command(files), path)
    assert done.returncode == 0, done.stderr
    assert unit.read_bytes() == b"old unit\n" and lock.read_bytes() == b"old lock\n"
    assert (tmp_path / "systemctl.log").read_text() == "daemon-reload\n"


def test_keep_refuses_files_that_are_not_the_recorded_release(tmp_path):
    unit = tmp_path / "rank.service"
    unit.write_bytes(b"an unfinished upgrade's unit\n")
    got = sh(keep_command([(str(unit), sha(b"old unit\n"))]))
    assert got.returncode != 0 and "is not the recorded release" in got.stderr
    assert not (tmp_path / "rank.service.prev").exists()


def test_restore_refuses_a_prev_copy_that_is_not_the_previous_release(tmp_path):
    unit = tmp_path / "rank.service"
    unit.write_bytes(b"new unit\n")
    (tmp_path / "rank.service.prev").write_bytes(b"something else\n")
    got = sh(restore_command([(str(unit), sha(b"old unit\n"))]), fake_systemctl(tmp_path))
    assert got.returncode != 0 and "cannot roll back" in got.stderr
    assert unit.read_bytes() == b"new unit\n"  # nothing half-restored
    assert not (tmp_path / "systemctl.log").exists()


# --- adopt, prune ---------------------------------------------------------------------------------


def old_layout(tmp_path, commit: str = C1):
    weights, config = tmp_path / "models", tmp_path / "etc"
    (weights / "model" / "sub").mkdir(parents=True)
    (weights / "model" / "sub" / "a.safetensors").write_bytes(b"x" * 10)
    (weights / "model.stamps.json").write_text('{"version": 1, "files": {}}')
    config.mkdir()
    (config / "model.lock.json").write_text(json.dumps({"repo": "o/r", "commit": commit}))
    return weights, config / "model.lock.json"


def test_adopt_renames_the_old_checkout_to_its_revision_keeping_inodes_and_stamps(tmp_path):
    weights, lock = old_layout(tmp_path)
    before = (weights / "model" / "sub" / "a.safetensors").stat()
    got = sh(adopt_command(str(weights), "model", str(lock)))
    assert got.returncode == 0, got.stderr
    moved = weights / f"model-{C1}" / "sub" / "a.safetensors"
    after = moved.stat()
    # the stamp of a file checks size, mtime, inode and ctime: renaming the parent keeps all
    assert (after.st_ino, after.st_mtime_ns, after.st_ctime_ns) == (
        before.st_ino, before.st_mtime_ns, before.st_ctime_ns
    )  # fmt: skip
    assert (weights / f"model-{C1}.stamps.json").exists()
    assert not (weights / "model").exists() and not (weights / "model.stamps.json").exists()
    assert sh(adopt_command(str(weights), "model", str(lock))).returncode == 0  # nothing left


def test_adopt_leaves_a_checkout_whose_revision_is_unknown_or_taken(tmp_path):
    weights, lock = old_layout(tmp_path)
    lock.write_text("{}")
    got = sh(adopt_command(str(weights), "model", str(lock)))
    assert got.returncode == 0 and "left in place" in got.stderr
    assert (weights / "model").is_dir()
    lock.write_text(json.dumps({"commit": C1}))
    (weights / f"model-{C1}").mkdir()
    got = sh(adopt_command(str(weights), "model", str(lock)))
    assert "both exist" in got.stderr and (weights / "model").is_dir()


def test_prune_removes_the_revision_its_stamps_status_and_fetch_lock_only(tmp_path):
    weights = tmp_path / "models"
    for c in (C1, C2):
        (weights / f"model-{c}").mkdir(parents=True)
        (weights / f"model-{c}.stamps.json").write_text("{}")
        (weights / f"model-{c}.fetch-status.json").write_text("{}")
        (weights / f"model-{c}.lock").write_text("")  # the fetcher's flock file (lab: left over)
    assert sh(prune_weights_command(str(weights), [f"model-{C1}"])).returncode == 0
    assert sorted(p.name for p in weights.iterdir()) == [
        f"model-{C2}", f"model-{C2}.fetch-status.json", f"model-{C2}.lock",
        f"model-{C2}.stamps.json",
    ]  # fmt: skip


def test_adopt_leaves_a_symlink_alone(tmp_path):
    weights, config = tmp_path / "models", tmp_path / "etc"
    (weights / "elsewhere").mkdir(parents=True)
    (weights / "model").symlink_to("elsewhere")  # not a checkout sparkrig made
    config.mkdir()
    (config / "model.lock.json").write_text(json.dumps({"commit": C1}))
    assert sh(adopt_command(str(weights), "model", str(config / "model.lock.json"))).returncode == 0
    assert (weights / "model").is_symlink() and not (weights / f"model-{C1}").exists()


def test_the_bench_gate_holds_each_stack_to_its_own_figures():
    """Within a stack the serving release's figures; across a switch the wanted stack's newest
    kept figures (a switch back), else none (its first figures become its baseline): Entrpi's
    engine is never held to vllm-nvfp4's speed, nor the reverse."""
    from dataclasses import replace

    from sparkrig.release import ReleaseReport, bench_to_reach

    nvfp4 = replace(rel(1), bench=(("single_stream_tok_s", 25.0),))
    entrpi = replace(rel(2), stack="entrpi-exl3", profile="single",
                     bench=(("single_stream_tok_s", 40.0),))  # fmt: skip
    upgrade = replace(rel(3), bench=())
    state = ReleaseReport(releases=(nvfp4,))
    assert bench_to_reach(nvfp4, state) == {}  # no change: nothing to hold
    assert bench_to_reach(upgrade, state) == {"single_stream_tok_s": 25.0}  # same stack
    assert bench_to_reach(replace(entrpi, bench=()), state) == {}  # first entrpi: its baseline
    back = ReleaseReport(releases=(entrpi, nvfp4))  # entrpi serves; switching back to nvfp4
    assert bench_to_reach(upgrade, back) == {"single_stream_tok_s": 25.0}
    assert bench_to_reach(replace(upgrade, stack="sfxnz-v13"), back) == {}
