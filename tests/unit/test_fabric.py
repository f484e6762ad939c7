"""The fabric's do-not-fragment check, run by a real shell against a stand-in ``ping``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sparkrig.fabric import ping_command, stray_addresses

PEERS = ["192.168.100.11", "192.168.100.12", "192.168.100.13"]

# Each stand-in ping marks its start, then answers only once every peer's ping has started
# (or gives up after 20 s): pings sent one after the other never all start, so they fail.
FAKE_PING = """#!/bin/sh
for last; do :; done
touch "$PINGDIR/started-$last"
i=0
while [ "$(ls "$PINGDIR" | grep -c '^started-')" -lt "$NPEERS" ]; do
  i=$((i + 1)); [ $i -gt 200 ] && exit 3
  sleep 0.1
done
echo "$*" >> "$PINGDIR/args"
[ -e "$PINGDIR/unreachable-$last" ] && exit 1
exit 0
"""


def run_check(tmp_path: Path, unreachable: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ping").write_text(FAKE_PING)
    (bin_dir / "ping").chmod(0o755)
    ping_dir = tmp_path / "pings"
    ping_dir.mkdir(exist_ok=True)
    for peer in unreachable:
        (ping_dir / f"unreachable-{peer}").touch()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PINGDIR": str(ping_dir)}
    env["NPEERS"] = str(len(PEERS))
    command = ping_command("enp1s0f1np1", PEERS, 9000)
    return subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)


def test_every_peer_is_pinged_at_once_with_full_size_do_not_fragment_packets(tmp_path):
    done = run_check(tmp_path)
    assert done.returncode == 0, done
    lines = (tmp_path / "pings" / "args").read_text().splitlines()
    assert sorted(line.split()[-1] for line in lines) == PEERS
    assert all(line.startswith("-M do -s 8972 ") and "-I enp1s0f1np1" in line for line in lines)


@pytest.mark.parametrize("peer", PEERS)
def test_the_check_fails_when_any_one_peer_does_not_answer(tmp_path, peer):
    assert run_check(tmp_path, unreachable=(peer,)).returncode != 0


def test_stray_fabric_addresses_are_those_of_the_fabric_subnet_but_the_plans():
    """Issue 47: the NIC may hold a link-local or another network's address; only an address
    of the fabric's subnet that the plan does not give goes, whatever its order."""
    held = ["10.200.0.222/24", "169.254.3.1/16", "10.200.0.2/24", "10.200.0.2/16", "192.0.2.7/24"]
    assert stray_addresses(held, "10.200.0.2/24", ["10.200.0.0/24"]) == [
        "10.200.0.222/24",
        "10.200.0.2/16",
    ]
    assert (
        stray_addresses(["10.200.0.2/24", "192.0.2.7/24"], "10.200.0.2/24", ["10.200.0.0/24"]) == []
    )
    # fabric_layout "ports": the fabric's whole range, another link's address included
    assert stray_addresses(
        ["198.18.1.1/24", "198.18.0.1/24"], "198.18.0.1/24", ["198.18.0.0/16"]
    ) == ["198.18.1.1/24"]
