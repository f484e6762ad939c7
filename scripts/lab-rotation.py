#!/usr/bin/env python3
"""The recovery lab test `make test` runs after LAB_CI: one of RECOVERY per run, so CI proves one
recovery path each time and every one in turn, where all of them together would not fit CI's 90
minutes (docs/testing.md).

Picked by the commit under test (`git rev-parse HEAD`: the same commit always runs the same one, a
red run is reproduced by running its commit again); outside a git checkout, by the day of the
year. Prints the pick, a `-k` word of the lab suite (tests/lab/test_lab.py); `--all` prints them
all, one a line. `make test LAB_ROTATING=<word>` runs another.

Each one starts from a serving pair and leaves it serving (the tests after it in the suite's
order assume so), and none is in LAB_CI (tests/unit/test_lab_rotation.py checks both lists)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Not in the rotation: the firmware reset's renumbered GID table is one netdev's pinned index
# (fabric_layout "single"), which CI's lab (the default, both functions) does not pin; it runs in
# `make lab-test SPARKRIG_LAB_FABRIC=single` (docs/testing.md).
RECOVERY = (
    "a_dead_worker_takes_the_head_down",
    "a_long_prefill_is_never_taken_for_a_wedge",
    "a_wedged_engine_is_restarted",
    "docker_restarted_on_a_rank_heals_by_itself",
    "docker_stopped_on_the_worker_is_healed",
    "an_administratively_down_fabric_link",
    "limit_worker_repairs_the_workers_fabric",
    "reboot_a_both_nodes_together",
    "reboot_b_the_worker_alone",
    "reboot_c_the_head_alone",
    "reboot_d_a_worker_off_longer",
)


def pick(key: int) -> str:
    return RECOVERY[key % len(RECOVERY)]


def commit() -> str | None:
    """The checkout's HEAD commit (40 hex digits), None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    head = out.stdout.strip()
    return head if out.returncode == 0 and len(head) == 40 else None


def key(head: str | None, yday: int) -> int:
    """The commit's first 8 hex digits as a number; the day of the year without one."""
    return int(head[:8], 16) if head else yday


def main(argv: list[str]) -> int:
    if argv == ["--all"]:
        print("\n".join(RECOVERY))
        return 0
    if argv:
        print(f"usage: {sys.argv[0]} [--all]", file=sys.stderr)
        return 2
    print(pick(key(commit(), time.localtime().tm_yday)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
