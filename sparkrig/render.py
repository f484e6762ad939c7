"""Render the templates/ directory with the same Jinja settings pyinfra's files.template uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"

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
