"""systemd from a host program, and the one builder of sparkrig's transient units.

The deploy runs long jobs (the weights fetch, the read-only servers) as transient units, so they
survive a dropped SSH session; ``transient_command`` is the command for that, whoever sends it
(the control side builds its remote commands with it)."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence

TRANSIENT = "systemd-run --quiet --collect --unit"


def transient_command(unit: str, argv: Sequence[str], *, replace: bool = True) -> str:
    """Shell command running ``argv`` as the transient unit ``unit``. ``replace``: stop a unit
    of that name first (a server started anew); else attach: start it only when it is not
    active already (a fetch a dropped run left running is followed, not started twice)."""
    q = shlex.quote(unit)
    run = f"{TRANSIENT} {q} {shlex.join(argv)}"
    if replace:
        return f"systemctl stop {q} 2>/dev/null; {run}"
    return f"(systemctl is-active --quiet {q} || {run})"


def unit_active(unit: str) -> bool:
    r = subprocess.run(["systemctl", "is-active", "--quiet", unit], check=False)
    return r.returncode == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def unit_main_pid(unit: str) -> int:
    r = subprocess.run(
        ["systemctl", "show", "-p", "MainPID", "--value", unit],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        return int(r.stdout.strip() or 0)
    except ValueError:
        return 0


def unit_state(unit: str) -> tuple[bool, bool]:
    out = subprocess.run(
        ["systemctl", "show", "--property=ActiveState", "--property=Result", unit],
        capture_output=True,
        text=True,
    ).stdout
    return parse_unit_state(out)


def parse_unit_state(show: str) -> tuple[bool, bool]:
    """(active or starting, went down on its own: a non-success result such as a dead container)
    from ``systemctl show`` KEY=VALUE lines (systemd prints them in its own order)."""
    props = dict(line.partition("=")[::2] for line in show.splitlines() if "=" in line)
    active = props.get("ActiveState") in ("active", "activating", "reloading")
    crashed = props.get("Result", "success") not in ("success", "")
    return active, crashed
