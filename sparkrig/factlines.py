"""How sparkrig's facts end their output: the end marker (a cut-off read is an error, never a
short answer) and ``key=value`` lines; and a host job's one JSON line among its other output."""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api.exceptions import FactProcessError

END = "##SPARKRIG-END##"


def parse_key_values(lines: list[str], what: str) -> dict[str, str]:
    """``key=value`` lines of a fact script that ends with the END marker (else it was cut)."""
    if END not in lines:
        raise FactProcessError(f"{what} ended early (no end marker)")
    raw: dict[str, str] = {}
    for line in lines:
        if "=" in line:
            key, _, value = line.partition("=")
            raw[key.strip()] = value.strip()
    return raw


def last_json(output: str) -> dict[str, Any] | None:
    """The last line of ``output`` that is a JSON object (a host job's result after its
    progress lines); None when there is none or it does not parse."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                got = json.loads(line)
            except ValueError:
                return None
            return got if isinstance(got, dict) else None
    return None
