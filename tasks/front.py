"""Phase 6b, the API front (docs/front.md): nginx on the head serves api_port and proxies to the
engine on 127.0.0.1:engine_port; every route but a plain GET /health needs the API key. Runs after
the service phase (the engine's key is decided there, once per run) and before the gates, which
go through the front. The site file, the key include and the TLS pair are owned whole; the whole
nginx config is checked (`nginx -t`) before a reload, and nginx reloads only when one changed.
nginx.service gets a drop-in of sparkrig's, so a killed or crashed front comes back by itself."""

from pyinfra import host, inventory
from pyinfra.operations import server

from sparkrig import hoststate
from sparkrig.config.inventory import current, for_inventory
from sparkrig.drain import drained
from sparkrig.endpoint import balanced, drain_include, drain_text
from sparkrig.front import (
    RESTART_DROPIN,
    SERVICE,
    front_package_installed,
    restart_dropin_text,
    wanted_files,
)
from sparkrig.fronttls import pair_tls
from sparkrig.ordering import on_head
from sparkrig.owned import dropin_present, file_present, unit_state_set
from sparkrig.pairsecret import api_key

settings = current()
is_head = settings.me.is_head
head_knobs = for_inventory(inventory)[settings.head.name].knobs

on_head(is_head, front_package_installed, name="Install nginx for the API front")
# The distribution's nginx.service never restarts (Restart=no): the drop-in restarts a front
# that was killed or crashed (docs/front.md), effective from systemd's reload, no nginx restart.
restart_dropin = on_head(
    is_head,
    dropin_present,
    name="Restart the API front when it dies (nginx.service drop-in)",
    text=restart_dropin_text(),
    dest=RESTART_DROPIN,
)
on_head(
    is_head,
    server.shell,
    name="Reload systemd after the API front's drop-in changed",
    commands=["systemctl daemon-reload"],
    _if=restart_dropin.did_change,
)
api = api_key(settings, hoststate.values)
tls = pair_tls(
    settings, hoststate.values
)  # the pair's CA's certificate (preflight refused a lost CA)
# The key include, the TLS pair and the site, each owned whole, in that order, by one operation
# (sparkrig/front.py wanted_files: a secret is never diffed, a file not wanted is removed).
changed = []
for f in host.loop(wanted_files(settings, head_knobs, api, tls)):
    op, args = f.operation()
    changed.append(on_head(is_head, op, name=f.name, **args))

# Behind one endpoint the drain include says whether this pair is in the balance: in it, unless
# this run drained the pair for a restart (tasks/stop.py): then it is put back only once the
# gates passed (tasks/verify.py).
if balanced(settings):
    changed.append(
        on_head(
            is_head,
            file_present,
            name="Keep the pair in the endpoint's balance (drain include)",
            text=drain_text(False),
            dest=drain_include(settings),
            _if=lambda: not drained(host.name),
        )
    )


def front_changed() -> bool:
    return any(op.did_change() for op in changed)


# A config nginx refuses fails the run here, before any reload: the running front keeps serving
# what it read last.
on_head(
    is_head,
    server.shell,
    name="Check the whole nginx config before the front reloads",
    commands=["nginx -t -q"],
    _if=front_changed,
)
on_head(
    is_head,
    unit_state_set,
    name="Run the API front",
    service=SERVICE,
    running=True,
    enabled=True,
)
on_head(
    is_head,
    unit_state_set,
    name="Reload the API front after its files changed",
    service=SERVICE,
    reloaded=True,
    _if=front_changed,
)
