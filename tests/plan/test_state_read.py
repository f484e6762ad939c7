"""A host whose state read fails fails alone, in one line: which host, which part, what to check;
no traceback, no prompt, and nothing but the read reaches any host."""

from __future__ import annotations

from sparkrig.stateread import StateReadFailed
from tests.plan import fakehosts
from tests.plan.harness import run
from tests.plan.test_plan import HEAD, INVENTORY, WORKER


def test_a_failed_state_read_fails_its_host_in_one_line_without_a_traceback(monkeypatch):
    fakehosts.inject("spark-b", {fakehosts.NODE: {"success": False, "stderr": "no sysfs"}})
    # as the operator types it: no -y, so pyinfra's own fact error would prompt and then crash
    r = run([INVENTORY, "deploy.py", "--dry"], monkeypatch)
    assert r.exit_code != 0
    # the CLI shows a pyinfra error as its one line ("--> pyinfra error in ...: <message>")
    shown = getattr(r.exception, "exception", r.exception)  # pyinfra_cli's WrappedError
    assert isinstance(shown, StateReadFailed), repr(r.exception)
    line = str(shown)
    assert "\n" not in line and "Traceback" not in r.output and "continue?" not in r.output
    assert line.startswith(f"{WORKER}: state read: node failed (exit 1); check: "), line
    check = (
        "check: SSH to the host as the inventory says (ssh_hostname, ssh_user, ssh_key), sudo "
        "for that user there (`sudo -v`) and python3 (DGX OS ships it), which its node "
        "part needs; `pyinfra INVENTORY deploy.py --dry -vvv` prints the read's command and output"
    )
    assert line.endswith(check), line
    assert "sparkrig." not in line  # no internal module: what the operator can check
    assert HEAD not in line and HEAD not in r.output.split("Loading: deploy.py")[1]
    for name, commands in r.commands.items():  # each host was read, nothing more
        assert all(c.startswith("sh -c ") and "##SPARKRIG-PART" in c for c in commands), name
