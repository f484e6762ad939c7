"""`make test`'s processes each run under scripts/suite.sh: its lines streamed as they come with
its name, its status kept, and one that runs past its bound stopped and named; the Makefile runs
all four so."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_test_runs_each_process_under_its_bound():
    """`make -n test` prints what it would run, running nothing."""
    out = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                         check=True)  # fmt: skip
    for name, bound in (("fast", 1200), ("plan", 1200), ("install", 1200), ("lab", 3600)):
        assert f"scripts/suite.sh {name} {bound} " in out.stdout, name


def suite(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "scripts/suite.sh", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_a_process_streams_its_lines_with_its_name_and_keeps_its_status():
    r = suite("demo", "30", "sh", "-c", "echo one; echo two >&2; exit 3")
    assert r.returncode == 3
    *lines, said = r.stdout.splitlines()
    assert lines == ["[demo] one", "[demo] two"]
    assert re.fullmatch(r"make test: the demo tests FAILED \(rc 3\) in \d+ s", said), said
    ok = suite("demo", "30", "SPARKRIG_X=1", "sh", "-c", "echo $SPARKRIG_X; echo '3 passed in 1s'")
    assert ok.returncode == 0
    *lines, said = ok.stdout.splitlines()
    # pytest's closing line again as written, for whoever counts
    assert lines == ["[demo] 1", "[demo] 3 passed in 1s", "3 passed in 1s"]
    assert re.fullmatch(r"make test: the demo tests passed in \d+ s", said), said


def test_a_process_past_its_bound_is_stopped_and_named():
    r = suite("plan", "1", "sh", "-c", "echo started; sleep 60")
    assert r.returncode == 124
    assert r.stdout.splitlines()[0] == "[plan] started"
    assert "make test: the plan tests TIMED OUT, stopped at their bound of 1 s" in r.stdout
