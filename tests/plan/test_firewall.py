"""The firewall (knob firewall, sparkrig/firewall.py) through the real CLI on strict @fake hosts:
a first run writes the ruleset and its unit (shown by --dry --diff), checks the ruleset with nft
before it is loaded and starts and enables the unit; a converged pair sends nothing of it; a
changed ruleset is checked and reloaded (atomic), never restarted; switched off, the unit is
stopped (its stop deletes the table) and both files go."""

from __future__ import annotations

from sparkrig import firewall
from tests.plan import fakehosts
from tests.plan.harness import run
from tests.plan.test_plan import ACTION, HEAD, INVENTORY, WORKER, apply, converge_state, position

RULES = "/etc/sparkrig/firewall.nft"
UNIT = firewall.UNIT_FILE
CHECK = f"/usr/sbin/nft -c -f {RULES}"


def test_dry_diff_shows_the_ruleset_and_the_unit(monkeypatch):
    r = run(["--dry", "--diff", INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert f"Will create {RULES}" in r.output and f"Will create {UNIT}" in r.output
    assert "table inet sparkrig {" in r.output
    assert "tcp dport 8000 counter drop" in r.output  # the head's API rule, in the diff
    assert not r.uploads.get(HEAD) and not r.uploads.get(WORKER)


def test_first_run_writes_checks_and_starts_it_before_the_fabric(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        rules = r.uploads[name][RULES].decode()
        assert rules.startswith("#!/usr/sbin/nft -f") and "delete table inet sparkrig" in rules
        assert "ExecStop=/usr/sbin/nft delete table inet sparkrig" in r.uploads[name][UNIT].decode()
        cmds = r.commands[name]
        assert cmds.index(CHECK) < cmds.index("systemctl start sparkrig-firewall.service")
        assert "systemctl enable sparkrig-firewall.service" in cmds
        assert "systemctl daemon-reload" in cmds[: cmds.index(CHECK) + 3]
    assert "tcp dport 8000" in r.uploads[HEAD][RULES].decode()
    assert "tcp dport 8000" not in r.uploads[WORKER][RULES].decode()
    assert position(r, "Own the sparkrig firewall ruleset") < position(
        r, "Persist the fabric address and MTU with netplan"
    )


def test_a_converged_pair_sends_nothing_of_it(monkeypatch):
    converge_state()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    acting = [c for cmds in r.commands.values() for c in cmds if ACTION.search(c)]
    assert not [c for c in acting if "firewall" in c], acting
    nft = [
        c for cmds in r.commands.values() for c in cmds if c.startswith(("/usr/sbin/nft", "if "))
    ]
    assert not nft, nft


def test_a_changed_ruleset_is_checked_and_reloaded_never_restarted(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--data", "api_allow=10.1.0.0/16,fd00::/8")
    assert r.exit_code == 0, r.output
    head = r.commands[HEAD]
    assert "10.1.0.0/16" in r.uploads[HEAD][RULES].decode()
    assert head.index(CHECK) < head.index("systemctl reload sparkrig-firewall.service")
    assert not [c for c in head if c.startswith(("systemctl restart sparkrig-firewall",
                                                 "systemctl stop sparkrig-firewall"))]  # fmt: skip
    assert RULES not in r.uploads.get(WORKER, {})  # api_allow is the head's alone
    assert CHECK not in r.commands[WORKER]


def test_a_table_gone_while_its_unit_ran_is_loaded_again(monkeypatch):
    converge_state()
    fakehosts.inject("spark-b", {fakehosts.FIREWALL: fakehosts.firewall_state(loaded=False)})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert "systemctl reload sparkrig-firewall.service" in r.commands[WORKER]
    assert "systemctl reload sparkrig-firewall.service" not in r.commands[HEAD]


def test_switched_off_the_unit_stops_and_both_files_go(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--data", "firewall=False")
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        cmds = r.commands[name]
        assert "systemctl stop sparkrig-firewall.service" in cmds
        assert "systemctl disable sparkrig-firewall.service" in cmds
        assert f"rm -f {RULES}" in cmds and f"rm -f {UNIT}" in cmds
