"""Secrets on the lab (issue 35 item 5): written through stdin, nothing left in the SSH user's
temp dir, every secret file 0600 root, a state read that carries digests only (even at -vvv).
Runs on a converged lab (tests/lab/test_lab.py's first converge, or SPARKRIG_LAB_KEEP=1 after
one); the lead runs it, never a helper session."""

from __future__ import annotations

import pytest

from lab.guest import API_KEY
from tests.lab.conftest import Lab, pyinfra

pytestmark = pytest.mark.lab
INV = "lab/inventory.py"
PAIR_TOKEN, HUB_TOKEN = "/etc/sparkrig/pair-token", "/etc/sparkrig/hf-token"


def secrets_of(lab: Lab) -> list[str]:
    values = [lab.head.sh(f"cat {PAIR_TOKEN}").strip(), lab.head.sh(f"cat {API_KEY}").strip()]
    assert all(len(v) >= 32 for v in values), "the lab is not converged"
    return values


def test_a_deploy_leaves_no_pyinfra_temp_file_and_every_secret_0600(lab: Lab):
    for guest in lab.guests:  # a temp file of an earlier version would fail the check below
        guest.sh("rm -f /tmp/pyinfra-* /var/tmp/pyinfra-*")
    r = pyinfra("-y", INV, "deploy.py")
    assert r.rc == 0, r.output[-4000:]
    for guest in lab.guests:
        left = guest.sh("ls /tmp/pyinfra-* /var/tmp/pyinfra-* 2>/dev/null; true").split()
        uploads = [p for p in left if "askpass" not in p]
        assert uploads == [], (guest.name, uploads)
        modes = guest.sh(
            f"stat -c '%a %U %G %n' {PAIR_TOKEN} "
            f"$(ls {API_KEY} {API_KEY}.env {HUB_TOKEN} 2>/dev/null)"
        ).splitlines()
        assert modes and all(line.startswith("600 root root ") for line in modes), modes
        assert not guest.sh("ls /etc/sparkrig/*.sparkrig-new 2>/dev/null; true").strip()
    # the lab's repos are public: the Hub token never rests on the head
    assert not lab.head.sh(f"ls {HUB_TOKEN} 2>/dev/null; true").strip()


def test_the_state_read_and_a_vvv_dry_run_carry_no_secret(lab: Lab):
    values = secrets_of(lab)
    r = pyinfra("--dry", "-vvv", INV, "deploy.py")
    assert r.rc == 0, r.output[-4000:]
    for secret in values:
        assert secret not in r.output
    assert f"sha256sum < {PAIR_TOKEN}" in r.output  # the digest read, printed at -vvv
    assert f"cat {PAIR_TOKEN}" not in r.output


def test_a_worker_that_lost_the_secret_gets_the_pairs_back_unprinted(lab: Lab):
    values = secrets_of(lab)
    worker = lab.workers[0]
    worker.sh(f"rm -f {PAIR_TOKEN}")
    r = pyinfra("-y", "-vvv", INV, "deploy.py", "--data", "pair_token_file=/nonexistent/none")
    assert r.rc == 0, r.output[-4000:]
    assert worker.sh(f"cat {PAIR_TOKEN}").strip() == values[0]
    assert worker.sh(f"stat -c %a {PAIR_TOKEN}").strip() == "600"
    for secret in values:
        assert secret not in r.output
