"""The deploy's (and `sparkrig check`'s) lockfile refusal: every lockfile the run needs that is
missing is named in one error, each with the command that makes it, and, when they are all the
stack's declared pins, the one command that makes every one (issue 49: a run per lockfile)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparkrig.config.inventory import build
from sparkrig.config.rules import lockfile_refusal
from tests.unit.conftest import cluster

ROOT = Path(__file__).resolve().parents[2]
MODEL = "LibertAIDAI/GLM-5.3-Flash-NVFP4"
DRAFTER = "incoai/GLM-5.3-Flash-DFlash2"
SINGLE = {"profile": "single", "drafter_license_accepted": True}  # loads the drafter


def test_two_missing_lockfiles_are_named_at_once_each_with_its_command(tmp_path):
    why = lockfile_refusal(build(cluster(lockfile_dir=str(tmp_path), **SINGLE)))
    assert why is not None and why.startswith("2 lockfile problems")
    for repo in (MODEL, DRAFTER):
        path = tmp_path / (repo.replace("/", "--") + ".lock.json")
        assert f"no lockfile {path} for {repo}; make it with:" in why
        assert f"refresh --repo {repo} --revision " in why and f"--out {path}" in why
    assert (
        "python3 -m sparkrig.lockfile refresh --stack vllm-nvfp4 --endpoint "
        f"https://huggingface.co --lockfile-dir {tmp_path}"
    ) in why


def test_a_pin_the_operator_set_gets_its_own_command_and_no_stack_command(tmp_path):
    other = "e" * 40  # not the declaration's: refresh --stack would lock another commit
    why = lockfile_refusal(
        build(cluster(lockfile_dir=str(tmp_path), model_revision=other, **SINGLE))
    )
    assert why is not None
    assert f"--repo {MODEL} --revision {other}" in why and DRAFTER in why
    assert "--stack" not in why


def test_one_missing_lockfile_is_one_sentence_with_its_command(tmp_path):
    why = lockfile_refusal(build(cluster(lockfile_dir=str(tmp_path))))  # shared: the model only
    assert why is not None and why.startswith(f"no lockfile {tmp_path}/") and DRAFTER not in why
    assert lockfile_refusal(build(cluster(lockfile_dir="tests/plan/locks", **SINGLE))) is None


def test_sparkrig_check_names_both_missing_lockfiles_in_one_run(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sparkrig", "check", "tests/plan/inventory_state.py",
         "--data", f"lockfile_dir={tmp_path}", "--data", "profile=single",
         "--data", "drafter_license_accepted=True"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"no lockfile {tmp_path}/LibertAIDAI--GLM-5.3-Flash-NVFP4.lock.json" in done.stderr
    assert f"no lockfile {tmp_path}/incoai--GLM-5.3-Flash-DFlash2.lock.json" in done.stderr
    assert "refresh --stack vllm-nvfp4" in done.stderr, done.stderr
