"""The firewall (knob firewall, sparkrig/firewall.py) through the real CLI on strict @fake hosts:
a first run writes the ruleset, its unit and the drop-ins that make the rank and its listening
helpers require it (shown by --dry --diff), checks the ruleset with nft before it is loaded and
starts and enables the unit; a converged pair sends nothing of it; a changed ruleset is checked
and reloaded (atomic), never restarted; switched off, the drop-ins go and systemd forgets them
before the unit stops (its stop deletes nothing), the table is deleted and both files go; off and
on again restarts no rank."""

from __future__ import annotations

from sparkrig import firewall
from tests.plan import fakehosts
from tests.plan.harness import run
from tests.plan.test_plan import (
    HEAD,
    INVENTORY,
    WORKER,
    acting,
    apply,
    converge_state,
    position,
)

RULES = "/etc/sparkrig/firewall.nft"
UNIT = firewall.UNIT_FILE
CHECK = f"/usr/sbin/nft -c -f {RULES}"
REQUIRES = "Requires=sparkrig-firewall.service"
DROPINS = {  # beside the rank and its listening helpers
    name: [f"/etc/systemd/system/{u}.service.d/sparkrig-firewall.conf" for u in units]
    for name, units in (
        (HEAD, ("sparkrig-head", "sparkrig-pair", "sparkrig-supervisor")),
        (WORKER, ("sparkrig-worker", "sparkrig-pair", "sparkrig-agent")),
    )
}
DELETE_OP = "Delete the firewall table while the firewall is switched off"
DELETE = "if /usr/sbin/nft list table inet sparkrig >/dev/null 2>&1; then /usr/sbin/nft delete"


def test_dry_diff_shows_the_ruleset_and_the_unit(monkeypatch):
    r = run(["--dry", "--diff", INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert f"Will create {RULES}" in r.output and f"Will create {UNIT}" in r.output
    assert "table inet sparkrig {" in r.output
    assert "tcp dport 8000 counter drop" in r.output  # the head's API rule, in the diff
    for path in [*DROPINS[HEAD], *DROPINS[WORKER]]:
        assert f"Will create {path}" in r.output, path
    assert f"+ {REQUIRES}" in r.output and "+ After=sparkrig-firewall.service" in r.output
    assert not r.uploads.get(HEAD) and not r.uploads.get(WORKER)


def test_first_run_writes_checks_and_starts_it_before_the_fabric(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        rules = r.uploads[name][RULES].decode()
        assert rules.startswith("#!/usr/sbin/nft -f") and "delete table inet sparkrig" in rules
        assert "ExecStop" not in r.uploads[name][UNIT].decode()  # its stop opens nothing
        cmds = r.commands[name]
        assert cmds.index(CHECK) < cmds.index("systemctl start sparkrig-firewall.service")
        assert "systemctl enable sparkrig-firewall.service" in cmds
        assert "systemctl daemon-reload" in cmds[: cmds.index(CHECK) + 3]
        # the rank and its listening helpers fail closed, from systemd's reload on
        for path in DROPINS[name]:
            assert REQUIRES in r.uploads[name][path].decode(), path
            made = cmds.index(f"mkdir -p {path.rsplit('/', 1)[0]}")
            assert made < cmds.index("systemctl daemon-reload") < cmds.index(CHECK)
        others = [p for p in r.uploads[name] if p.endswith("sparkrig-firewall.conf")]
        assert sorted(others) == sorted(DROPINS[name])  # the watchdog listens on nothing
    assert "tcp dport 8000" in r.uploads[HEAD][RULES].decode()
    assert "tcp dport 8000" not in r.uploads[WORKER][RULES].decode()
    assert position(r, "Own the sparkrig firewall ruleset") < position(
        r, "Persist the fabric address and MTU with netplan"
    )


def test_a_converged_pair_sends_nothing_of_it(monkeypatch):
    converge_state()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert not acting(r, "firewall"), acting(r, "firewall")
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


def test_switched_off_nothing_requires_it_before_it_stops_then_the_table_and_files_go(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--data", "firewall=False")
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        cmds = r.commands[name]
        stop = cmds.index("systemctl stop sparkrig-firewall.service")
        # a stop of a unit the rank requires would stop the rank with it: the drop-ins go and
        # systemd forgets them first
        for path in DROPINS[name]:
            assert cmds.index(f"rm -f {path}") < cmds.index("systemctl daemon-reload") < stop
        assert "systemctl disable sparkrig-firewall.service" in cmds
        # the unit's stop deletes nothing: the deploy deletes the table, then the files go
        delete = [i for i, c in enumerate(cmds) if c.startswith(DELETE)]
        assert delete and stop < delete[0] < cmds.index(f"rm -f {UNIT}")
        assert f"rm -f {RULES}" in cmds
        assert not [c for c in cmds if c.startswith("systemctl stop sparkrig-head")], cmds
    assert f"tasks/firewall.py | {DELETE_OP}" in r.changed_ops[HEAD]


def converge_off() -> None:
    """The fakes answer as ranks the deploy converged with the firewall off."""
    for name, s in fakehosts.settings_of(INVENTORY).items():
        off = s.model_copy(update={"knobs": s.knobs.model_copy(update={"firewall": False})})
        fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(off)


def test_a_table_left_while_the_firewall_is_off_is_deleted_and_nothing_else_acts(monkeypatch):
    converge_off()
    fakehosts.inject("spark-b", {fakehosts.FIREWALL: fakehosts.firewall_state(loaded=True)})
    r = apply(monkeypatch, "--data", "firewall=False")
    assert r.exit_code == 0, r.output
    assert [c for c in r.commands[WORKER] if c.startswith(DELETE)]
    assert not [c for c in r.commands[HEAD] if c.startswith(DELETE)]
    changing = acting(r)
    assert not changing, changing  # no drop-in to remove, no unit to stop, no systemd reload


def rank_commands(r) -> list[str]:
    """What the run asked systemd of any rank's unit."""
    ranks = ("sparkrig-head", "sparkrig-worker")
    return [
        c
        for cmds in r.commands.values()
        for c in cmds
        if c.startswith("systemctl ") and any(u in c for u in ranks)
    ]


def test_switched_off_then_on_again_restarts_no_rank(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--data", "firewall=False")
    assert r.exit_code == 0, r.output
    assert not rank_commands(r), rank_commands(r)
    converge_off()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert not rank_commands(r), rank_commands(r)
    for name in (HEAD, WORKER):  # the drop-ins written: the ranks require the firewall from now
        assert sorted(p for p in r.uploads[name] if p.endswith("sparkrig-firewall.conf")) == sorted(
            DROPINS[name]
        )
        assert "systemctl start sparkrig-firewall.service" in r.commands[name]
