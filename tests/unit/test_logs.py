"""``python3 -m sparkrig logs`` (sparkrig/logs.py): each rank's journals over SSH as the
inventory says, every line prefixed with its rank; run against a stand-in ``ssh``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sparkrig.logs import journal_command, ssh_argv, units_of

ROOT = Path(__file__).resolve().parents[2]


def test_the_head_reads_its_supervisor_and_watchdog_a_worker_its_agent():
    assert units_of("sparkrig-head", True) == (
        "sparkrig-head", "sparkrig-pair", "sparkrig-supervisor", "sparkrig-watchdog",
    )  # fmt: skip
    assert units_of("sparkrig-worker", False) == (
        "sparkrig-worker",
        "sparkrig-pair",
        "sparkrig-agent",
    )


def test_ssh_as_the_inventory_says_with_its_pinned_host_keys():
    data = {"ssh_hostname": "127.0.0.1", "ssh_port": 2222, "ssh_user": "spark",
            "ssh_key": ".lab/id", "ssh_known_hosts_file": ".lab/known_hosts"}  # fmt: skip
    argv = ssh_argv(data, "lab-worker1")
    assert argv[-1] == "spark@127.0.0.1" and ("-p", "2222") == argv[3:5]
    assert "UserKnownHostsFile=.lab/known_hosts" in argv and "StrictHostKeyChecking=yes" in argv
    cmd = journal_command(["sparkrig-worker", "sparkrig-pair"], 50, follow=True)
    assert (
        "sudo -n journalctl --no-pager -o short-iso -n 50 -u sparkrig-worker -u sparkrig-pair -f"
        in cmd
    )


def test_logs_rank_1_reads_the_workers_units_alone(tmp_path):
    fake = tmp_path / "ssh"
    fake.write_text('#!/bin/sh\nfor a; do last="$a"; done\necho "asked: $last"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, "-m", "sparkrig", "logs", "--inventory", "tests/plan/inventory_state.py",
         "--rank", "1", "-n", "7"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[rank1 @fake/spark-b] asked: "), lines
    assert "-u sparkrig-worker -u sparkrig-pair -u sparkrig-agent" in lines[0]
    assert "sparkrig-head" not in lines[0] and "-n 7" in lines[0]


def test_logs_of_two_pairs_name_each_lines_pair_and_pair_reads_one_alone(tmp_path):
    fake = tmp_path / "ssh"
    fake.write_text('#!/bin/sh\nfor a; do last="$a"; done\necho "asked: $last"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}

    def logs(*args: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "sparkrig", "logs", "--inventory",
             "tests/plan/inventory_pairs.py", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return [line.split("] ")[0] + "]" for line in done.stdout.splitlines()]

    assert logs("--rank", "1") == ["[pair_a rank1 @fake/spark-b]", "[pair_b rank1 @fake/spark-d]"]
    assert logs("--pair", "pair_b") == [
        "[pair_b rank0 @fake/spark-c]",
        "[pair_b rank1 @fake/spark-d]",
    ]
