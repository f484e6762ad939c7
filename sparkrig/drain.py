"""The commands that take a pair out of the endpoint's balance before it restarts and put it back
once it passed its gates (sparkrig/endpoint.py says how the balance works)."""

from __future__ import annotations

import shlex

from sparkrig import hostpkg
from sparkrig.config.model import Settings
from sparkrig.endpoint import drain_include, drain_text
from sparkrig.engines import progress_parser
from sparkrig.helperunits import progress_url
from sparkrig.runscope import Watch, watch


def drains() -> Watch:
    """The run's drain operations by head name (tasks/stop.py adds them, tasks/verify.py and
    tasks/rollback.py put a drained pair back)."""
    return watch("drain", Watch)


def drained(head: str) -> bool:
    """For ``_if``: did this run drain ``head``'s pair out of the balance?"""
    return bool(drains().changed(head))


def _write_and_reload(s: Settings, out_of_balance: bool) -> str:
    """Write the drain include, then reload a running front; a front that is stopped, or whose
    config nginx refuses, keeps the file for its next start and never blocks the restart."""
    path = shlex.quote(drain_include(s))
    text = shlex.quote(drain_text(out_of_balance))
    return (
        f"printf '%s' {text} > {path}.tmp && mv -f {path}.tmp {path} && "
        "if systemctl is-active --quiet nginx && nginx -t -q; then systemctl reload nginx; "
        "else echo 'the API front is not running: the drain include waits for its start'; fi"
    )


def drain_command(s: Settings) -> str:
    """The head's drain before a pair restart: set the drain include, reload the front, then wait
    until the engine has no request in flight or ``drain_timeout_s`` passed (the tasks run it
    only where the front is installed: on a first deploy nothing serves)."""
    wait = hostpkg.command(
        s.knobs.install_dir,
        "gate",
        "drain",
        "--metrics",
        progress_url(s),
        "--parser",
        progress_parser(s.stack),
        "--timeout",
        str(s.knobs.drain_timeout_s),
    )
    return f"{_write_and_reload(s, True)} && {shlex.join(wait)}"


def restore_command(s: Settings) -> str:
    """The head's return into the balance once its pair passed the gates."""
    return _write_and_reload(s, False)
