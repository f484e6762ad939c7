"""The head's API as the control machine reaches it: its URL, the CA it is verified with, and
what `python3 -m sparkrig.bench --inventory` and the release's bench gate measure there."""

from __future__ import annotations

from typing import Any

from sparkrig import lockfile
from sparkrig.config.inventory import build, view_of
from sparkrig.config.model import Settings, api_scheme


def api_url(s: Settings) -> str:
    """The head's API as the control machine reaches it: the head's host data ``api_url``
    (the lab forwards the port to loopback), else https://<its ssh_hostname or inventory
    name>:<api_port> (http:// with api_tls off). The bench and the release's bench gate both
    measure this."""
    default = f"{api_scheme(s.knobs)}://{s.head.address}:{s.knobs.api_port}"
    return (s.head.api_url or default).rstrip("/")


def api_ca_file(s: Settings) -> str | None:
    """The CA a client of the head's API verifies it with: the pair's own (``api_tls_dir``)
    unless the operator's certificate (tls_cert) or plain HTTP; None: the system's trust."""
    k = s.knobs
    return f"{k.api_tls_dir.rstrip('/')}/ca.crt" if k.api_tls and k.tls_cert is None else None


def drafter_lock(s: Settings) -> str | None:
    """The control side's lockfile of the drafter the profile loads (its files' sha256, what
    the bench records beside the drafter's acceptance); None when the profile loads none."""
    drafter = s.drafter
    if not s.needs_drafter or drafter is None:
        return None
    return str(lockfile.lock_path(s.knobs.lockfile_dir, drafter.repo))


def api_target(inventory: Any) -> dict[str, Any]:
    """What `python3 -m sparkrig.bench --inventory` measures: the head's API as the control
    machine reaches it (``api_url``), the served model, the profile and the control side's API
    key file (None when api_auth is off), the stack it serves and on how many ranks (its
    published figures), and the drafter's lockfile (``drafter_lock``)."""
    s = next(v for v in build(view_of(inventory)).values() if v.me.is_head)
    k = s.knobs
    return {
        "stack": k.stack,
        "url": api_url(s),
        "model": k.served_model_name,
        "profile": k.profile,
        "api_key_file": k.api_key_file if k.api_auth else None,
        "ca_file": api_ca_file(s),
        "nnodes": s.nnodes,
        "drafter_lock": drafter_lock(s),
    }
