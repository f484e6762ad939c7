"""The recovery lab test `make test` adds to LAB_CI (scripts/lab-rotation.py): each word it can
pick names exactly one lab test, one that LAB_CI leaves out; the pick follows the commit and
reaches every one; the Makefile hands it to the lab process after LAB_CI."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from sparkrig.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
rotation = load_script("lab_rotation", ROOT / "scripts" / "lab-rotation.py")


def lab_tests() -> list[str]:
    """Every test function of the lab suite, by name."""
    names = []
    for path in sorted((ROOT / "tests" / "lab").glob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names += [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    return [n for n in names if n.startswith("test_")]


def lab_ci() -> list[str]:
    """The Makefile's LAB_CI, its `-k` words."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    m = re.search(r"^LAB_CI := (.*)$", text, re.M)
    assert m, "no LAB_CI in the Makefile"
    return m.group(1).split(" or ")


def matches(word: str, names: list[str]) -> list[str]:
    return [n for n in names if word.strip().lower() in n.lower()]


@pytest.mark.parametrize("word", rotation.RECOVERY)
def test_each_recovery_word_selects_one_lab_test_that_lab_ci_leaves_out(word):
    names = lab_tests()
    assert len(matches(word, names)) == 1, matches(word, names)
    chosen = matches(word, names)[0]
    assert not [w for w in lab_ci() if chosen in matches(w, names)], f"{chosen} is in LAB_CI"


def test_the_pick_follows_the_commit_and_reaches_every_recovery_test():
    head = "a3f1" + "0" * 36
    assert rotation.key(head, 200) == 0xA3F10000  # the commit's, whatever the day
    assert rotation.key(None, 200) == 200  # outside a checkout, the day of the year
    picks = {rotation.pick(k) for k in range(len(rotation.RECOVERY))}
    assert picks == set(rotation.RECOVERY)


def test_the_script_prints_this_commits_pick():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    out = subprocess.run(["python3", "scripts/lab-rotation.py"], cwd=ROOT, capture_output=True,
                         text=True, check=True)  # fmt: skip
    said = out.stdout.strip()
    assert said in rotation.RECOVERY
    if head.returncode == 0:
        assert said == rotation.pick(int(head.stdout.strip()[:8], 16))
    listed = subprocess.run(["python3", "scripts/lab-rotation.py", "--all"], cwd=ROOT,
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert listed.stdout.split() == list(rotation.RECOVERY)


def test_make_test_hands_the_pick_to_the_lab_process_after_lab_ci():
    """`make -n test` prints what it would run, running nothing."""
    out = subprocess.run(["make", "-n", "test", "LAB_ROTATING=reboot_c_the_head_alone"],
                         cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    said = out.stdout.replace("\\\n", " ")  # a recipe line continued, as one
    lab = [ln for ln in said.splitlines() if "scripts/suite.sh lab" in ln]
    assert len(lab) == 1, out.stdout
    assert re.search(r'-k "dgx_os_network_stack or .* or reboot_c_the_head_alone"', lab[0]), lab
    assert "this run's recovery lab test: reboot_c_the_head_alone" in out.stdout
