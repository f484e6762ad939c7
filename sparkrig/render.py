"""Render the templates/ directory with the same Jinja settings pyinfra's files.template uses, and
the context every template gets (the rank's identity and sparkrig's paths)."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from sparkrig import REPO, hostpkg
from sparkrig.config.model import Settings
from sparkrig.paths import paths

TEMPLATES = REPO / "templates"

_ENV = Environment(
    loader=FileSystemLoader(str(TEMPLATES)),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
)


def render(name: str, **context: Any) -> str:
    """Render ``templates/<name>``; a missing variable is an error, never an empty string."""
    return _ENV.get_template(name).render(**context)


def base_context(s: Settings) -> dict[str, Any]:
    """What every template of a rank gets: who it is, its unit and container, and the paths."""
    return {
        "host": s.me.name,
        "rank": s.me.rank,
        "role": s.me.role,
        "nnodes": s.nnodes,
        "ip": s.me.ip,
        "interface": s.me.fabric_interface,
        # the helpers' sockets: every address a peer dials this rank at, each with the port
        # given, and bound to the fabric netdev where one netdev reaches every peer
        "listen": s.listen_on,
        "bind": f" --bind-device {s.helper_device}" if s.helper_device else "",
        "unit": s.unit_name,
        "container": s.container_name,
        "sparkhost": " ".join(hostpkg.invocation(s.knobs.install_dir)),  # + JOB ARGS
        **paths(s).by_name(),
    }
