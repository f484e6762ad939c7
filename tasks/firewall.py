"""Phase 2b, firewall (knob ``firewall``, sparkrig/firewall.py, docs/firewall.md): the table
``inet sparkrig`` of this rank, rendered whole into ``<config_dir>/firewall.nft`` and loaded by
``sparkrig-firewall.service`` at every boot. A changed ruleset is checked with ``nft -c -f``
before it is loaded; the load (the unit's reload) is one nft transaction, so the old rules hold
until the new ones are in. Nothing else of the host's ruleset is touched. Switched off, the
unit is stopped (its stop deletes the table) and both files go."""

from pyinfra import host
from pyinfra.operations import server

from sparkrig import firewall, hoststate
from sparkrig.owned import file_absent, file_present, unit_state_set
from sparkrig.settings import current

settings = current()
knobs = settings.knobs
state = hoststate.read(settings).firewall
rules_path = firewall.ruleset_path(settings)

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

    def changed() -> bool:
        return rules.did_change() or unit.did_change() or not state.loaded

    server.shell(
        name="Check the sparkrig firewall ruleset with nft before it is loaded",
        commands=[f"{firewall.NFT} -c -f {rules_path}"],
        _if=changed,
    )
    unit_state_set(
        name="Reload the sparkrig firewall after its ruleset or unit changed",
        service=firewall.UNIT,
        reloaded=True,
        daemon_reload=True,
        _if=changed,
    )
    unit_state_set(
        name="Keep the sparkrig firewall loaded and enabled at boot",
        service=firewall.UNIT,
        running=True,
        enabled=True,
    )
else:
    unit_state_set(
        name="Stop the sparkrig firewall while it is switched off (its stop deletes the table)",
        service=firewall.UNIT,
        running=False,
        enabled=False,
    )
    server.shell(
        name="Delete the table inet sparkrig while the firewall is switched off",
        # the unit's stop deleted it already when the unit ran: only a table left without it
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
