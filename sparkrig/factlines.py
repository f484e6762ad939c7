"""How sparkrig's facts run their shell scripts and end their output: a script is a file of
sparkrig/facts/ run with its values as positional parameters; its output ends with the end
marker (a cut-off read is an error, never a short answer) in ``key=value`` lines; and a host
job's one JSON line among its other output."""

from __future__ import annotations

import json
import shlex
from functools import cache
from importlib import resources
from typing import Any

from pyinfra.api import QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError

END = "##SPARKRIG-END##"


@cache
def script(name: str) -> str:
    """The text of sparkrig/facts/``name``.sh, as shipped in the package."""
    return resources.files("sparkrig").joinpath("facts", f"{name}.sh").read_text()


def script_command(name: str, *args: str) -> StringCommand:
    """``sh -c <facts/name.sh> sparkrig-<name> ARGS``: the script with ``args`` as its
    positional parameters, each one quoted, so a value reaches the shell as data, never as code
    (a name is ``$0``, what the shell's own messages start with)."""
    quoted = (QuoteString(a) for a in args)
    return StringCommand("sh", "-c", QuoteString(script(name)), f"sparkrig-{name}", *quoted)


def script_inline(name: str, *args: str) -> str:
    """The script as a piece of a larger one: ``set --`` gives it ``args`` (each quoted) as its
    positional parameters. It sets shell variables: run it last, or in a subshell."""
    return f"set -- {shlex.join(args)}\n{script(name)}"


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
