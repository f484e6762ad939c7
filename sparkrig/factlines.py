"""How sparkrig's facts end their output: the end marker (a cut-off read is an error, never a
short answer) and ``key=value`` lines."""

from __future__ import annotations

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
