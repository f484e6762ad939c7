"""How the deploy gets onto a host, SSH and then sudo, and what it says when its first command
(the state read) fails before any of it ran: the cause found in what the host printed, and the
next step.

pyinfra 3.10 runs every command of a ``_sudo`` deploy as ``sudo -H -n ...``; when sudo answers
``sudo: a password is required`` it asks the operator ``sudo password:`` once per host, at that
first command, and sends it again with the password (pyinfra/connectors/util.py,
``execute_command_with_sudo_retry``). ``--same-sudo-password`` asks once for every host before
the run; ``--use-sudo-password`` sets a value nothing reads in 3.x (pyinfra issue #1850, PR #1961
open), so it is not named here."""

from __future__ import annotations

import logging
import re
from types import TracebackType
from typing import Any

from pyinfra.connectors.util import SUDO_PASSWORD_REQUIRED_LINES

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
NOPASSWD = "let this user sudo without one (a sudoers drop-in: `<user> ALL=(ALL) NOPASSWD: ALL`)"


class HostLines(logging.Handler):
    """What pyinfra prints for one host while in use (a failed fact's output goes to its log,
    one record per line, prefixed with the host): the lines, without the prefix or colours."""

    def __init__(self, target: Any) -> None:
        super().__init__()
        self.prefix = _ANSI.sub("", target.print_prefix)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = _ANSI.sub("", record.getMessage())
        if text.startswith(self.prefix) and "could not load fact" not in text:  # pyinfra's own
            self.lines.append(text[len(self.prefix) :].strip())

    def __enter__(self) -> HostLines:
        logging.getLogger("pyinfra").addHandler(self)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        logging.getLogger("pyinfra").removeHandler(self)


def first_command_failed(lines: list[str]) -> str:
    """Why the first command did not run on a host, from what it printed (``lines``), and what
    to do."""
    said = " / ".join(lines[-2:])
    if any(line in SUDO_PASSWORD_REQUIRED_LINES for line in lines):
        return (
            f"sudo asks this user for a password and got none ({said}): type it when pyinfra "
            "asks `sudo password:` at the first command (a terminal is needed), or give it once "
            f"for every host with `pyinfra --same-sudo-password ...`, or {NOPASSWD}"
        )
    if any("incorrect password" in line or "try again" in line for line in lines):
        return (
            f"sudo refused the password typed at pyinfra's `sudo password:` prompt ({said}): "
            f"run again and type this user's sudo password, or {NOPASSWD}"
        )
    if any("sudoers" in line for line in lines):
        return (
            f"this user may not sudo ({said}): log in as an administrator (ssh_user in the "
            "inventory) or add the user to the sudo group"
        )
    return (
        f"the first command failed before any part of the state read ran ({said or 'no output'}"
        "): check that SSH logs in (`ssh <host> true`), that sudo runs without a prompt or with "
        "the password pyinfra asks for (`ssh -t <host> sudo true`), and that /bin/sh runs there"
    )
