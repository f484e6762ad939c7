"""Phase 2b, firewall (knob ``firewall``, sparkrig/firewall.py, docs/firewall.md): the table
``inet sparkrig`` of this rank, rendered whole into ``<config_dir>/firewall.nft`` and loaded by
``sparkrig-firewall.service`` at every boot. A changed ruleset is checked with ``nft -c -f``
before it is loaded; the load (the unit's reload) is one nft transaction, so the old rules hold
until the new ones are in. Nothing else of the host's ruleset is touched. The rank and its
listening helpers require the unit (a drop-in beside each), so they fail closed: a table that
did not load at boot starts none of them. Switched off, the drop-ins go first (systemd reloaded,
so the unit's stop reaches no rank), then the unit is stopped, the table deleted (the unit's stop
deletes nothing) and both files removed."""

from pyinfra import host
from pyinfra.operations import server

from sparkrig import firewall, hoststate
from sparkrig.config.inventory import current
from sparkrig.owned import dropin_present, file_absent, file_present, unit_state_set

settings = current()
knobs = settings.knobs
report = hoststate.read(settings)
state = report.firewall
rules_path = firewall.ruleset_path(settings)
DAEMON_RELOAD = "systemctl daemon-reload"

if knobs.firewall and settings.me.is_head and not knobs.api_allow:
    host.log(f"api_allow is empty: api_port {knobs.api_port} answers loopback only")
if knobs.firewall:
    server.shell(
        name="Install nft (the nftables package; nftables.service stays off)",
        commands=[firewall.INSTALL],
        _if=lambda: not state.nft,
    )
    rules = file_present(
        name="Own the sparkrig firewall ruleset",
        text=firewall.ruleset(settings),
        dest=rules_path,
    )
    unit = file_present(
        name="Install the sparkrig firewall unit",
        text=firewall.unit(settings),
        dest=firewall.UNIT_FILE,
    )
    # Fail closed: the rank and its helpers start only after the table is loaded, and not at all
    # when it failed to load (Requires= and After=, beside their own unit files: docs/firewall.md)
    requires = [
        dropin_present(
            name="Make the rank and its listening helpers require the sparkrig firewall",
            text=firewall.requires_text(),
            dest=path,
        )
        for path in host.loop(firewall.requires_dropins(settings))
    ]

    def changed() -> bool:
        return rules.did_change() or unit.did_change() or not state.loaded

    server.shell(
        name="Reload systemd after the firewall's unit or drop-ins changed",
        commands=[DAEMON_RELOAD],
        _if=lambda: unit.did_change() or any(d.did_change() for d in requires),
    )
    server.shell(
        name="Check the sparkrig firewall ruleset with nft before it is loaded",
        commands=[f"{firewall.NFT} -c -f {rules_path}"],
        _if=changed,
    )
    # A reload, never a restart: a restart of the unit would restart every unit requiring it
    # (the ranks, each alone); a reload reaches none of them.
    unit_state_set(
        name="Reload the sparkrig firewall after its ruleset or unit changed",
        service=firewall.UNIT,
        reloaded=True,
        _if=changed,
    )
    unit_state_set(
        name="Keep the sparkrig firewall loaded and enabled at boot",
        service=firewall.UNIT,
        running=True,
        enabled=True,
    )
else:
    gone = [
        file_absent(
            name="Remove the rank's and its helpers' requirement of the firewall while it is off",
            path=path,
        )
        for path in host.loop(firewall.requires_dropins(settings))
    ]
    # systemd forgets the requirement before the unit stops: a stop of a required unit would stop
    # the rank and its helpers with it (out of the pair's order, behind the run's back)
    unit_down = report.owned.is_down(firewall.UNIT)
    server.shell(
        name="Reload systemd so that nothing requires the firewall before it stops",
        commands=[DAEMON_RELOAD],
        _if=lambda: any(g.did_change() for g in gone) or not unit_down,
    )
    unit_state_set(
        name="Stop the sparkrig firewall while it is switched off (its stop deletes nothing)",
        service=firewall.UNIT,
        running=False,
        enabled=False,
    )
    server.shell(
        name="Delete the firewall table while the firewall is switched off",
        commands=[
            f"if {firewall.NFT} list table {firewall.TABLE} >/dev/null 2>&1; "
            f"then {firewall.NFT} delete table {firewall.TABLE}; fi"
        ],
        _if=lambda: state.loaded,
    )
    file_absent(
        name="Remove the sparkrig firewall ruleset while it is switched off", path=rules_path
    )
    file_absent(
        name="Remove the sparkrig firewall unit while it is switched off", path=firewall.UNIT_FILE
    )
