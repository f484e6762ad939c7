"""Phase 6b, the API front (docs/front.md): nginx on the head serves api_port and proxies to the
engine on 127.0.0.1:engine_port; every route but a plain GET /health needs the API key. Runs after
the service phase (the engine's key is decided there, once per run) and before the gates, which
go through the front. The site file, the key include and the TLS pair are owned whole; the whole
nginx config is checked (`nginx -t`) before a reload, and nginx reloads only when one changed."""

from pyinfra import host, inventory
from pyinfra.operations import server

from sparkrig import hoststate
from sparkrig.front import (
    SERVICE,
    front_package_installed,
    front_paths,
    key_include_text,
    site_text,
    tls_text,
)
from sparkrig.ordering import on_head
from sparkrig.owned import file_absent, file_present, secret_installed, unit_state_set
from sparkrig.pairsecret import api_key
from sparkrig.settings import current, for_inventory

settings = current()
is_head = settings.me.is_head
head_knobs = for_inventory(inventory)[settings.head.name].knobs
front = front_paths(settings)

on_head(is_head, front_package_installed, name="Install nginx for the API front")
changed = []
api = api_key(settings, hoststate.values)
if head_knobs.api_auth and api is not None and api.token:
    changed.append(
        on_head(
            is_head,
            secret_installed,
            name="Install the API front's key include",
            text=key_include_text(api.token),
            dest=front["key_include"],
        )
    )
elif not head_knobs.api_auth:
    changed.append(
        on_head(
            is_head,
            file_absent,
            name="Remove the API front's key include while api_auth is off",
            path=front["key_include"],
        )
    )
if head_knobs.tls_cert is not None and head_knobs.tls_key is not None:
    changed.append(
        on_head(
            is_head,
            file_present,
            name="Install the API front's TLS certificate",
            text=tls_text(head_knobs.tls_cert, "tls_cert"),
            dest=front["tls_cert"],
        )
    )
    changed.append(
        on_head(
            is_head,
            secret_installed,
            name="Install the API front's TLS key",
            text=tls_text(head_knobs.tls_key, "tls_key"),
            dest=front["tls_key"],
        )
    )
else:
    for path in host.loop([front["tls_cert"], front["tls_key"]]):
        changed.append(
            on_head(
                is_head,
                file_absent,
                name="Remove the API front's TLS files while it serves HTTP",
                path=path,
            )
        )
changed.append(
    on_head(
        is_head,
        file_present,
        name="Install the API front's nginx site",
        text=site_text(settings),
        dest=front["site"],
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
