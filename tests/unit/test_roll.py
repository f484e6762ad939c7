"""``python3 -m sparkrig roll`` (sparkrig/roll.py): a release through several pairs, one pair at a
time: each pair's deploy limited to its hosts, in inventory order, the --data passed on; the first
pair that fails stops the roll and the pairs after it are never reached. pyinfra itself is a
stand-in on PATH that records its argv (no host is reached)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sparkhost import gate
from sparkhost.wedge import Sample

ROOT = Path(__file__).resolve().parents[2]
PAIRS = "tests/plan/inventory_pairs.py"  # @fake hosts as pair_a (a, b) and pair_b (c, d)


def roll(tmp: Path, *args: str, fail_on: str = "") -> tuple[subprocess.CompletedProcess[str], list]:
    bin_dir, calls = tmp / "bin", tmp / "calls.jsonl"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "pyinfra"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"sys.exit(3 if {fail_on!r} and {fail_on!r} in sys.argv else 0)\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "sparkrig", "roll", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    seen = [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []
    return done, seen


def limits(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--limit"]


def test_each_pair_is_deployed_alone_in_order_with_the_same_data(tmp_path):
    done, calls = roll(tmp_path, PAIRS, "--data", "profile=long")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [limits(c) for c in calls] == [
        ["@fake/spark-a", "@fake/spark-b"],
        ["@fake/spark-c", "@fake/spark-d"],
    ]
    for argv in calls:
        assert argv[:3] == ["-y", PAIRS, "deploy.py"] and argv[-2:] == ["--data", "profile=long"]
    assert "pair_a: the new release (profile=long); pair_b: the release it served" in done.stdout
    assert done.stdout.rstrip().endswith(
        "Now: pair_a: the new release (profile=long); pair_b: the new release (profile=long)"
    )


def test_the_first_pair_that_fails_stops_the_roll_and_the_next_is_never_reached(tmp_path):
    done, calls = roll(tmp_path, PAIRS, "--data", "profile=long", fail_on="@fake/spark-a")
    assert done.returncode == 3
    assert [limits(c) for c in calls] == [["@fake/spark-a", "@fake/spark-b"]]
    assert "pair_a failed (exit 3)" in done.stdout and "pair_b not rolled" in done.stdout


def test_a_refused_inventory_reaches_no_pair(tmp_path):
    done, calls = roll(tmp_path, PAIRS, "--data", "profil=long")
    assert done.returncode == 1 and calls == []
    assert "profil: unknown key" in done.stdout


def test_drain_waits_for_the_requests_in_flight_then_says_so():
    samples = iter([Sample(2, 1, 0, 0), Sample(1, 0, 0, 0), Sample(0, 0, 0, 0)])
    now = iter([0.0, 0.0, 2.0, 4.0])
    said: list[str] = []
    rc = gate.drain("http://x/metrics", "vllm-metrics", 60, read=lambda u, p: next(samples),
                    clock=lambda: next(now), sleep=lambda s: None, emit=said.append)  # fmt: skip
    assert rc == 0 and said == ["drained: no request in flight after 4 s"]


def test_drain_gives_up_at_its_bound_and_an_engine_that_is_gone_has_nothing_to_drain():
    said: list[str] = []
    clock = iter([0.0, 30.0, 61.0])
    rc = gate.drain("http://x/metrics", "vllm-metrics", 60, read=lambda u, p: Sample(3, 0, 0, 0),
                    clock=lambda: next(clock), sleep=lambda s: None, emit=said.append)  # fmt: skip
    assert rc == 0 and said == ["drain bound reached: 3 request(s) still in flight after 60 s"]

    def gone(url: str, parser: str) -> Sample:
        raise OSError("connection refused")

    said.clear()
    assert gate.drain("http://x/metrics", "vllm-metrics", 60, read=gone, emit=said.append) == 0
    assert said[0].startswith("drained: the engine does not answer")
