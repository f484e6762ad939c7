"""uninstall.py through the real CLI against strict @fake hosts: the pair stops head first, every
file sparkrig owns goes, the fabric connection is dropped the way the deploy applies it, the
weights stay unless purge_weights, --dry changes nothing, and a bare node is left alone."""

from __future__ import annotations

import re

from tests.plan import fakehosts
from tests.plan.harness import Run, run
from tests.plan.test_plan import HEAD, INVENTORY, WORKER, converge_state, position

WEIGHTS = "/var/lib/sparkrig/models"
OWNED = [
    "/etc/systemd/system/sparkrig-head.service",
    "/etc/systemd/system/sparkrig-pair.service",
    "/etc/sysctl.d/90-sparkrig.conf",
    "/etc/netplan/60-sparkrig-fabric.yaml",
]


def uninstall(monkeypatch, *extra: str) -> Run:
    return run([*extra, INVENTORY, "uninstall.py"], monkeypatch)


def test_uninstall_stops_the_head_first_and_removes_what_sparkrig_owns(monkeypatch):
    converge_state()
    r = uninstall(monkeypatch, "-y")
    assert r.exit_code == 0, r.output
    head, worker = r.commands[HEAD], r.commands[WORKER]
    # the deploy's ordered stop (tasks/pair_stop.py): the head's supervisor and watchdog first, so
    # neither starts a rank again, then every rank in one operation; all of them disabled
    stop_ranks = position(r, "Stop every rank (the head's supervisor and watchdog are stopped)")
    assert position(r, "Stop the head's supervisor and watchdog") < stop_ranks
    for helper in ("sparkrig-supervisor", "sparkrig-watchdog"):
        assert head.index(f"systemctl stop {helper}.service") < head.index(
            "systemctl stop sparkrig-head.service"
        )
        assert f"systemctl disable {helper}.service" in head
    for cmds, unit in ((head, "sparkrig-head"), (worker, "sparkrig-worker")):
        assert f"systemctl stop {unit}.service" in cmds
        assert f"systemctl disable {unit}.service" in cmds
    for path in OWNED:
        assert f"rm -f {path}" in head, path
    assert "rm -f /etc/systemd/system/sparkrig-agent.service" in worker
    # the API front: its site goes, then nginx reloads without it (or stops, if sparkrig put it)
    site = head.index("rm -f /etc/nginx/conf.d/sparkrig-api.conf")
    assert site < next(i for i, c in enumerate(head) if fakehosts.FRONT_OFF.match(c))
    assert not any(fakehosts.FRONT_OFF.match(c) for c in worker)
    for cmds in (head, worker):  # a rank that exited non-zero on stop is not left "failed"
        assert cmds.index("systemctl daemon-reload") < cmds.index(
            "systemctl reset-failed 'sparkrig-*'"
        )
    # the fabric as tasks/fabric.py applies it: generate + reload, never `netplan apply`
    for cmds in (head, worker):
        netplan = cmds.index("rm -f /etc/netplan/60-sparkrig-fabric.yaml")
        assert netplan < cmds.index("netplan generate") < cmds.index("nmcli connection reload")
        assert not any(c.startswith("netplan apply") for c in cmds)
        for directory in ("/etc/sparkrig", "/opt/sparkrig", "/var/lib/sparkrig/cache"):
            assert f"rm -rf {directory}" in cmds, directory
        assert f"rm -rf {WEIGHTS}" not in cmds  # the weights stay
        assert any(fakehosts.PRUNE.search(c) for c in cmds)  # the sparkrig images go
    assert f"weights kept in {WEIGHTS}" in r.output
    base = f"docker image rm {fakehosts.IMAGE} >/dev/null"
    assert any(c.startswith(base) for c in head)  # the head pulled it by digest
    assert not any(c.startswith(base) for c in worker)  # the worker's copy had only our tags
    assert head.index("systemctl stop sparkrig-head.service") < head.index(
        next(c for c in head if c.startswith(base))
    )


def test_purge_weights_removes_them_too(monkeypatch):
    converge_state()
    r = uninstall(monkeypatch, "-y", "--data", "purge_weights=True")
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        assert f"rm -rf {WEIGHTS}" in r.commands[name]


def test_dry_diff_shows_the_removals_and_changes_nothing(monkeypatch):
    converge_state()
    r = uninstall(monkeypatch, "--dry", "--diff")
    assert r.exit_code == 0, r.output
    assert "Remove the fabric netplan file" in " ".join(r.changed_ops[HEAD])
    acting = re.compile(
        r"^(systemctl (stop|disable|daemon-reload|reset-failed)|rm |netplan|nmcli|docker image rm)"
    )
    assert not [c for cmds in r.commands.values() for c in cmds if acting.search(c)]


def test_a_bare_node_is_left_alone(monkeypatch):
    r = uninstall(monkeypatch, "-y")
    assert r.exit_code == 0, r.output
    assert r.changed_ops == {}, r.changed_ops


def test_uninstall_removes_the_grub_drop_in_and_regenerates_the_menu(monkeypatch):
    from sparkrig.baseline import GRUB_DROPIN

    converge_state()
    fakehosts.inject(
        "spark-b",
        {fakehosts.stat_of(GRUB_DROPIN): f"user=root group=root mode=-rw-r--r-- atime=0 mtime=0 "
         f"ctime=0 size=300 '{GRUB_DROPIN}'"},
    )  # fmt: skip
    r = uninstall(monkeypatch, "-y")
    assert r.exit_code == 0, r.output
    worker = r.commands[WORKER]
    removed = [i for i, c in enumerate(worker) if c.startswith("rm -f") and GRUB_DROPIN in c]
    assert removed and worker.index("update-grub") > removed[0]
    assert "update-grub" not in r.commands[HEAD]  # it had no drop-in


def test_uninstall_removes_every_base_the_head_pulled_not_only_the_current(monkeypatch):
    """A pair that served another stack before: its base, pulled by the head and listed in the
    head's pulled-images record, goes too (a digest reference keeps an image after its tags)."""
    converge_state()
    old = "ghcr.io/example/old-stack@sha256:" + "ab" * 32
    fakehosts.inject(
        "spark-a", {fakehosts.contents_of(fakehosts.PULLED_IMAGES): [fakehosts.IMAGE, old]}
    )
    r = uninstall(monkeypatch, "-y")
    assert r.exit_code == 0, r.output
    head, worker = r.commands[HEAD], r.commands[WORKER]
    for ref in (fakehosts.IMAGE, old):
        removals = [c for c in head if c.startswith(f"docker image rm {ref} >/dev/null")]
        assert len(removals) == 1, ref
    assert not any(c.startswith(f"docker image rm {old}") for c in worker)


def test_uninstall_deletes_the_firewall_table_and_removes_every_drop_in(monkeypatch):
    """The firewall unit's stop leaves the table (fail closed): uninstall deletes it itself, after
    the ranks and the unit stopped; the drop-ins go (the firewall's beside the rank and its
    helpers, the front's beside nginx.service), then their directories when empty, then systemd
    reloads."""
    from sparkrig import firewall
    from sparkrig.front import RESTART_DROPIN

    converge_state()
    r = uninstall(monkeypatch, "-y")
    assert r.exit_code == 0, r.output
    delete = "if nft list table inet sparkrig >/dev/null 2>&1; then nft delete table inet sparkrig"
    for name, s in fakehosts.settings_of(INVENTORY).items():
        cmds = r.commands[name]
        deleted = [i for i, c in enumerate(cmds) if c.startswith(delete)]
        assert deleted, name
        assert cmds.index(f"systemctl stop {s.unit_name}.service") < deleted[0]
        assert cmds.index("systemctl stop sparkrig-firewall.service") < deleted[0]
        dropins = firewall.requires_dropins(s) + ([RESTART_DROPIN] if s.me.is_head else [])
        for path in dropins:
            assert cmds.index(f"rm -f {path}") < cmds.index("systemctl daemon-reload"), path
        rmdir = next(i for i, c in enumerate(cmds) if c.startswith("for d in "))
        assert all(p.rsplit("/", 1)[0] in cmds[rmdir] for p in dropins)
        assert rmdir < cmds.index("systemctl daemon-reload")
    assert f"rm -f {RESTART_DROPIN}" not in r.commands[WORKER]  # a worker has no front
