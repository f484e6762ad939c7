"""``python3 -m sparkrig check`` (sparkrig/check.py): the refusals that need no host, offline,
as the deploy would say them: a misspelled knob, a wrong type, a missing pinned host key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKE = "tests/plan/inventory_state.py"  # @fake hosts: nothing to connect to


def check(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkrig", "check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_good_inventory_passes_offline():
    done = check(FAKE)
    assert done.returncode == 0, done.stderr
    assert "2 ranks" in done.stdout


def test_a_misspelled_knob_and_a_wrong_type_are_refused_offline():
    done = check(FAKE, "--data", "profil=guard")
    assert done.returncode == 1
    assert "profil: unknown key; did you mean 'profile'?" in done.stderr
    done = check(FAKE, "--data", "fabric_mtu=lots")
    assert done.returncode == 1 and "fabric_mtu" in done.stderr, done.stderr


def test_a_host_key_not_pinned_is_refused_offline(tmp_path):
    inv = tmp_path / "inventory.py"
    known = tmp_path / "known_hosts"
    known.write_text("")
    inv.write_text(
        "from tests.plan.inventory_state import head, worker\n"
        # a plain name, over SSH (an @fake/ host has no SSH host key to pin)
        f"head = [(n.split('/')[1], {{**d, 'ssh_hostname': '198.51.100.7', 'ssh_port': 2222,"
        f" 'ssh_known_hosts_file': {str(known)!r}}}) for n, d in head]\n"
    )
    done = check(str(inv))
    assert done.returncode == 1
    assert f"no host key for [198.51.100.7]:2222 in {known}" in done.stderr, done.stderr
    assert "ssh-keyscan -p 2222 198.51.100.7" in done.stderr


def test_the_deploy_says_the_same_refusals_before_it_reaches_any_host(tmp_path):
    """The real ``pyinfra`` executable on hosts nothing listens for: the refusal comes from
    config.py, before pyinfra connects (no "Connecting to hosts", no host's error)."""
    inv = tmp_path / "inventory.py"
    inv.write_text(
        "import runpy\n"
        f"_shipped = runpy.run_path({str(ROOT / 'inventory.py')!r})\n"
        "head = [(n, {**d, 'ssh_hostname': '127.0.0.1', 'ssh_port': 9}) for n, d in"
        " _shipped['head']]\n"
        "worker = [(n, {**d, 'ssh_hostname': '127.0.0.1', 'ssh_port': 9}) for n, d in"
        " _shipped['worker']]\n"
    )
    done = subprocess.run(
        ["pyinfra", "-y", str(inv), "deploy.py", "--data", "profil=guard"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "is refused before any host is reached" in out
    assert "every host: profil: unknown key; did you mean 'profile'?" in out
    assert "Connecting to hosts" not in out and "pyinfra error" not in out
    # a read-only command is not stopped by it: status.py gets as far as the hosts
    status = subprocess.run(["pyinfra", str(inv), "status.py", "--data", "profil=guard"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)  # fmt: skip
    assert "Connecting to hosts" in status.stdout + status.stderr


def test_an_inventory_of_two_pairs_passes_offline_naming_its_pairs():
    done = check("tests/plan/inventory_pairs.py")
    assert done.returncode == 0, done.stderr
    assert "4 ranks in 2 pairs (pair_a 2, pair_b 2)" in done.stdout
