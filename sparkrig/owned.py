"""What sparkrig owns on a host, as pyinfra's ``files.put``, ``files.directory``, ``files.file``
and ``systemd.service`` do it (same commands, same ``--diff`` output, same no-op reasons), but
decided from the host's one state read (sparkrig/stateread.py) instead of facts per operation:
whole files (text, secrets, programs, systemd drop-ins), directories, and the deploy's systemd
units."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Generator
from dataclasses import dataclass, replace
from io import BytesIO
from pathlib import PurePosixPath
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.output import format_text
from pyinfra.facts.files import FileContents
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations.util import files as file_utils
from pyinfra.operations.util.files import generate_color_diff

from sparkrig.failing import fail_host
from sparkrig.secretio import install_command
from sparkrig.stateread import NotDeclared, Part, Values, read_here

# ---------------------------------------------------------------------------------------------
# The facts: owned files and directories, owned units (parts of the state read, stateread.py)
# ---------------------------------------------------------------------------------------------


def apt_installed_command(package: str) -> str:
    """The shell command installing a distribution ``package``: apt's lists as they are, and
    only when that fails (lists older than the archive: a 404) updated first."""
    install = f"DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {package}"
    return f"{{ {install} || {{ apt-get update && {install}; }}; }}"


@dataclass(frozen=True)
class PathState:
    """What ``stat`` says of a path sparkrig owns; ``sha256`` only for regular files."""

    kind: str  # "file", "dir", "link" or "other"
    mode: int = 0  # octal digits as pyinfra's facts give them: 644, 600, 755
    user: str = ""
    group: str = ""
    sha256: str = ""


_SHA_LINE = re.compile(r"^([0-9a-f]{64})  (.+)$")  # sha256sum's "<hash>  <path>"
_STAT_KINDS = {"file": "files", "dir": "dirs"}  # what stat -c names each section's paths


def _each_path(paths: tuple[str, ...], kind_test: str, stat_kind: str, *then: str) -> str:
    """One section of OwnedPaths' command: a line per path from shell builtins alone, then one
    ``stat`` (and ``then``) over the paths that are of the section's kind."""
    listed = " ".join(shlex.quote(p) for p in paths)
    return (
        f'set --; for p in {listed}; do if [ -L "$p" ]; then echo "link $p"; '
        f'elif [ {kind_test} "$p" ]; then set -- "$@" "$p"; elif [ -e "$p" ]; then '
        f'echo "other $p"; else echo "none $p"; fi; done; '
        f'if [ $# -gt 0 ]; then stat -c "{stat_kind} %a %U %G %n" -- "$@"'
        + "".join(f" && {t}" for t in then)
        + "; fi"
    )


class OwnedPaths(FactBase[dict[str, dict[str, "PathState | None"]]]):
    """
    Every file and directory sparkrig owns on a host, in one command of three processes
    (``stat`` over the directories, ``stat`` and ``sha256sum`` over the files) whatever their
    number: process start-up, not the work, is what a read costs under TCG and over sudo.

    + files: paths of whole files: ``PathState("file", mode, user, group, sha256)``
    + dirs: paths of directories: ``PathState("dir", mode, user, group)``

    Either kind is ``PathState("link")`` / ``PathState("other")`` when something else is
    there, None when nothing is. Returns ``{"files": {path: ...}, "dirs": {path: ...}}``.
    """

    def command(self, files: tuple[str, ...], dirs: tuple[str, ...]) -> str:
        return (
            "echo dirs:; "
            + _each_path(dirs, "-d", "dir")
            + "; echo files:; "
            + _each_path(files, "-f", "file", 'sha256sum -- "$@"')
        )

    def process(self, output: list[str]) -> dict[str, dict[str, PathState | None]]:
        found: dict[str, dict[str, PathState | None]] = {"files": {}, "dirs": {}}
        sums: dict[str, str] = {}
        section: dict[str, PathState | None] | None = None
        for line in output:
            if line in ("dirs:", "files:"):
                section = found[line[:-1]]
                continue
            sha = _SHA_LINE.match(line)
            kind, _, rest = line.partition(" ")
            if section is None or not rest:
                raise FactProcessError(f"owned paths: unexpected line {line!r}")
            if sha and section is found["files"]:
                sums[sha[2]] = sha[1]
            elif kind in ("link", "other"):
                section[rest] = PathState(kind)
            elif kind == "none":
                section[rest] = None
            elif kind in _STAT_KINDS and section is found[_STAT_KINDS[kind]]:
                mode, user, group, path = (rest.split(" ", 3) + ["", "", ""])[:4]
                if not (mode.isdigit() and path):
                    raise FactProcessError(f"owned paths: unexpected line {line!r}")
                section[path] = PathState(kind, int(mode), user, group)
            else:
                raise FactProcessError(f"owned paths: unexpected line {line!r}")
        for path, state in found["files"].items():
            if state is not None and state.kind == "file":
                if path not in sums:
                    raise FactProcessError(f"owned paths: no sha256 for {path}")
                found["files"][path] = replace(state, sha256=sums[path])
        return found

    @staticmethod
    def default() -> dict[str, dict[str, PathState | None]]:
        return {"files": {}, "dirs": {}}


# SubStates of a unit with no job left to stop: anything else (start-pre, start, stop-sigterm,
# auto-restart, ...) is on its way up or down, and an ordered stop must still stop it
STOPPED_SUBSTATES = ("dead", "failed", "")


class UnitStates(FactBase[dict[str, tuple[bool, bool, bool]]]):
    """
    (running, enabled, down) of each of sparkrig's units in one ``systemctl show``: running and
    enabled as pyinfra's ``SystemdStatus`` and ``SystemdEnabled`` read them (the same states
    count), down when nothing of it is left to stop (``STOPPED_SUBSTATES``: a unit still in its
    start gate is neither running nor down), whatever the number of units. A unit systemd does
    not know is (False, False, True).

    + units: unit names with their ``.service``
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "systemctl"

    def command(self, units: tuple[str, ...]) -> str:
        listed = " ".join(shlex.quote(u) for u in units)
        return (
            "systemctl show --all --property Id --property SubState --property UnitFileState "
            + listed
        )

    def process(self, output: list[str]) -> dict[str, tuple[bool, bool, bool]]:
        states: dict[str, dict[str, str]] = {}
        unit: str | None = None
        for line in output:
            key, sep, value = line.strip().partition("=")
            if not sep:
                unit = None
            elif key == "Id":
                unit = value
                states.setdefault(unit, {})
            elif unit is not None:
                states[unit][key] = value
        return {
            name: (
                got.get(SystemdStatus.state_key) in SystemdStatus.state_values,
                got.get(SystemdEnabled.state_key) in SystemdEnabled.state_values,
                got.get(SystemdStatus.state_key, "") in STOPPED_SUBSTATES,
            )
            for name, got in states.items()
        }

    @staticmethod
    def default() -> dict[str, tuple[bool, bool, bool]]:
        return {}


# ---------------------------------------------------------------------------------------------
# Their parts of the state read, and the typed reader of them
# ---------------------------------------------------------------------------------------------


def paths_part(files: list[str], dirs: list[str]) -> Part:
    """The state read's part of every owned file and directory."""
    return Part("paths", OwnedPaths, (("dirs", tuple(dirs)), ("files", tuple(files))))


def units_part(units: list[str]) -> Part:
    """The state read's part of every unit an operation looks at (with ``.service``)."""
    return Part("units", UnitStates, (("units", tuple(units)),))


@dataclass(frozen=True)
class OwnedReport:
    """What a state read says of the owned paths and units it was asked for (another path or
    unit raises KeyError: it was not read)."""

    files: dict[str, PathState | None]
    dirs: dict[str, PathState | None]
    running: dict[str, bool]  # unit (with .service) -> running
    enabled: dict[str, bool]
    down: dict[str, bool]  # nothing of it left to stop (not running, not starting)

    def file(self, path: str) -> PathState | None:
        if path not in self.files:
            raise KeyError(f"{path} is not in the state read (sparkrig/hoststate.py owned_files)")
        return self.files[path]

    def dir(self, path: str) -> PathState | None:
        if path not in self.dirs:
            raise KeyError(f"{path} is not in the state read (sparkrig/hoststate.py owned_dirs)")
        return self.dirs[path]

    def unit(self, service: str) -> tuple[bool, bool]:
        """(running, enabled) of ``service`` (``.service`` added when missing)."""
        name = service if "." in service else f"{service}.service"
        if name not in self.running:
            raise KeyError(f"{name} is not in the state read (sparkrig/hoststate.py units)")
        return self.running[name], self.enabled.get(name, False)

    def is_down(self, service: str) -> bool:
        """Whether ``service`` has nothing left to stop (a unit in its start gate has)."""
        name = service if "." in service else f"{service}.service"
        self.unit(name)  # KeyError when it was not read
        return self.down.get(name, True)


def owned_of(values: Values) -> OwnedReport:
    """The owned paths and units of ``values`` (those parts read, or none)."""
    report: dict[str, dict[str, Any]] = {
        "files": {}, "dirs": {}, "running": {}, "enabled": {}, "down": {}
    }  # fmt: skip
    if "paths" in values:
        said = values.get("paths", OwnedPaths)
        for what, asked in values.part("paths").args:
            unsaid = set(asked) - set(said[what])
            if unsaid:
                raise FactProcessError(f"state read: nothing said of {unsaid}")
            report[what] = {p: said[what][p] for p in asked}
    if "units" in values:
        states = values.get("units", UnitStates)
        for unit in values.args("units")["units"]:
            running, enabled, down = states.get(unit, (False, False, True))
            report["running"][unit], report["enabled"][unit], report["down"][unit] = (
                running, enabled, down
            )  # fmt: skip
    return OwnedReport(**report)


# ---------------------------------------------------------------------------------------------
# The operations
# ---------------------------------------------------------------------------------------------


@operation()
def file_present(
    text: str, dest: str, mode: str = "644", user: str = "root", group: str = "root"
) -> Generator[Any, None, None]:
    """
    Own a whole file with the given content (diffed under ``--diff``, even when new).

    Decided from the host's state read (sha256, mode, owner), never a per-file fact.

    + text: the complete file content
    + dest: remote path; its directory must already exist (so the diff is shown on creation)
    + mode: octal permissions
    + user: owner
    + group: group
    """
    yield from owned_put(text.encode(), dest, mode, user, group)


def owned_put(
    data: bytes, dest: str, mode: str, user: str, group: str, secret: bool = False
) -> Generator[Any, None, None]:
    """What pyinfra's ``files.put`` does for a file in the state read: upload (then chown and
    chmod) when absent or its sha256 differs, else fix mode and owner; the same ``--diff``
    output ("Will create"/"Will modify" and a unified diff, mode and chown lines). The current
    content of a differing file is read (one command) only under ``--diff``. ``secret``: never
    diffed, written 0600 beside ``dest`` and renamed over it."""
    have = owned_of(read_here("paths")).file(dest)
    want_mode = int(mode)
    diff = host.state.config.DIFF
    if have is not None and have.kind == "file" and have.sha256 == hashlib.sha256(data).hexdigest():
        changed = False
        if have.mode != want_mode:
            if diff and not secret:
                logger.info("mode %s", format_text(str(have.mode), "red"))
                logger.info("mode %s", format_text(str(want_mode), "green"))
            yield file_utils.chmod(dest, want_mode)
            changed = True
        if have.user != user or have.group != group:
            if diff and not secret:
                logger.info("chown %s:%s", have.user, have.group)
                logger.info("chown %s:%s", user, group)
            yield file_utils.chown(dest, user, group)
            changed = True
        if not changed:
            host.noop(f"file {dest} is already uploaded" + (" (content not shown)" * secret))
        return
    if secret:
        logger.info(f"{host.print_prefix}Will write {dest} (secret: content not shown)")
        # One command fed on stdin (sparkrig/secretio.py): written beside dest under umask 077,
        # its digest checked, renamed over dest; no temp file as the SSH user, none left behind,
        # the secret in no argv. A failure leaves the old secret (or none), never a partial one.
        yield install_command(data.decode(), dest)
        return
    if diff:
        current: list[str] = []
        if have is None:
            host.log(f"Will create {format_text(dest, bold=True)}", logger.info)
        else:
            host.log(f"Will modify {format_text(dest, bold=True)}", logger.info)
            current = [line + "\n" for line in host.get_fact(FileContents, path=dest) or []]
        try:
            desired = data.decode().splitlines(keepends=True)
            for line in generate_color_diff(current, desired):
                logger.info("  %s", line)
        except UnicodeDecodeError:
            logger.info("Binary file uploaded")
        logger.info("")
    yield FileUploadCommand(BytesIO(data), dest, remote_temp_filename=host.get_temp_filename(dest))
    yield file_utils.chown(dest, user, group)
    yield file_utils.chmod(dest, want_mode)


SYSTEMD_DIR = "/etc/systemd/system"


def dropin_path(unit: str, name: str) -> str:
    """Where sparkrig's systemd drop-in ``name`` (without ``.conf``) of ``unit`` (with
    ``.service``) lives: beside a unit the deploy does not write (the distribution's
    ``nginx.service``: docs/front.md) or beside its own, for what another phase decides (the
    firewall's ``Requires=`` on the rank and its helpers: docs/firewall.md)."""
    return f"{SYSTEMD_DIR}/{unit}.d/{name}.conf"


@operation()
def dropin_present(text: str, dest: str) -> Generator[Any, None, None]:
    """
    Own a systemd drop-in whole (``file_present``'s commands and ``--diff`` output, 0644 root),
    its ``.d`` directory made first when the drop-in is not there (and left when it goes: the
    operator's own drop-ins may live in it). It counts from ``systemctl daemon-reload``, which
    the phase owning it sends.

    + text: the drop-in's content
    + dest: its path (``dropin_path``)
    """
    commands = owned_put(text.encode(), dest, "644", "root", "root")
    if owned_of(read_here("paths")).file(dest) is None:
        # its upload drawn first, so that owned_put has said "Will create" and shown the diff
        # (pyinfra's --dry draws only an operation's first command)
        upload = next(commands)
        yield StringCommand("mkdir", "-p", QuoteString(str(PurePosixPath(dest).parent)))
        yield upload
    yield from commands


@operation()
def directory_owned(
    path: str, mode: str = "755", user: str = "root", group: str = "root"
) -> Generator[Any, None, None]:
    """
    A directory sparkrig creates, decided from the host's state read (``files.directory``'s
    commands: mkdir, chmod, chown).

    + path: remote path
    + mode: octal permissions
    + user: owner
    + group: group
    """
    have = owned_of(read_here("paths")).dir(path)
    want_mode = int(mode)
    if have is None:
        yield StringCommand("mkdir", "-p", QuoteString(path))
        yield file_utils.chmod(path, want_mode)
        yield file_utils.chown(path, user, group)
        return
    if have.kind != "dir":
        yield fail_host(f"{path} exists and is not a directory ({have.kind})")
        return
    changed = False
    if have.mode != want_mode:
        yield file_utils.chmod(path, want_mode)
        changed = True
    if have.user != user or have.group != group:
        yield file_utils.chown(path, user, group)
        changed = True
    if not changed:
        host.noop(f"directory {path} already exists")


@operation()
def file_absent(path: str) -> Generator[Any, None, None]:
    """
    Remove a file sparkrig owned (decided from the host's state read).

    + path: remote path
    """
    if owned_of(read_here("paths")).file(path) is None:
        host.noop(f"file {path} does not exist")
        return
    yield StringCommand("rm", "-f", QuoteString(path))


JOURNAL_LINES = 25  # of a unit whose start failed: its start gate's refusal and what to change


def start_command(unit: str, journal: bool = False) -> StringCommand:
    """``systemctl start`` of ``unit``; ``journal``: when the start fails, its last journal
    lines go to stderr, which pyinfra shows under the failure (systemctl itself only says
    "see journalctl"), so a start gate's refusal (sparkhost prep) is read where the run fails."""
    start = StringCommand("systemctl", "start", QuoteString(unit))
    if not journal:
        return start
    shown = f"journalctl -u {shlex.quote(unit)} -n {JOURNAL_LINES} -o cat --no-pager >&2"
    return StringCommand(start, "||", "{", shown + ";", "exit", "1;", "}")


@operation()
def unit_state_set(
    service: str,
    running: bool | None = None,
    enabled: bool | None = None,
    restarted: bool = False,
    daemon_reload: bool = False,
    reloaded: bool = False,
    journal_on_failure: bool = False,
) -> Generator[Any, None, None]:
    """
    A systemd unit of this deploy, as ``systemd.service`` does it (same commands and no-op
    reasons), decided from the host's state read instead of two facts per operation.

    + service: unit name (``.service`` added when missing)
    + running: start (True) or stop (False) it (also a unit still starting); None leaves it
    + enabled: enable (True) or disable (False) it; None leaves it
    + restarted: restart it when it runs
    + reloaded: reload it when it runs (``ExecReload=``)
    + daemon_reload: ``systemctl daemon-reload`` first
    + journal_on_failure: a failed start prints the unit's last journal lines (``start_command``)
    """
    name = service if "." in service else f"{service}.service"
    try:
        report = owned_of(read_here("units"))
        is_running, is_enabled = report.unit(name)
        is_down = report.is_down(name)
    except NotDeclared:  # a deploy without the state read (uninstall.py): pyinfra's facts
        is_running = bool(host.get_fact(SystemdStatus, services=[name]).get(name))
        is_enabled = enabled is not None and bool(
            host.get_fact(SystemdEnabled, services=[name]).get(name)
        )
        is_down = not is_running
    if daemon_reload:
        yield StringCommand("systemctl", "daemon-reload")
    if running is False:
        # a unit in its start gate is not running yet but would be: stopping cancels that start
        if not is_down:
            yield StringCommand("systemctl", "stop", QuoteString(name))
        else:
            host.noop(f"service {name} is stopped")
    if running is True:
        if not is_running:
            yield start_command(name, journal_on_failure)
        else:
            host.noop(f"service {name} is running")
    if restarted and is_running:
        yield StringCommand("systemctl", "restart", QuoteString(name))
    if reloaded and is_running:
        yield StringCommand("systemctl", "reload", QuoteString(name))
    if enabled is True and not is_enabled:
        yield StringCommand("systemctl", "enable", QuoteString(name))
    elif enabled is False and is_enabled:
        yield StringCommand("systemctl", "disable", QuoteString(name))


@operation()
def secret_installed(text: str, dest: str) -> Generator[Any, None, None]:
    """
    Own a 0600 root file whose content is never printed (no diff, not in any command line).

    + text: the content
    + dest: remote path (directory must exist)
    """
    yield from owned_put(text.encode(), dest, "600", "root", "root", secret=True)


def secret_temp(dest: str) -> str:
    """Where ``secret_installed`` writes a secret before renaming it over ``dest`` (same dir:
    sparkrig/secretio.py's install script)."""
    return f"{dest}.sparkrig-new"


@operation()
def program_installed(src: str, dest: str) -> Generator[Any, None, None]:
    """
    Install a module of the host package (files/sparkhost) as root, mode 0644: python3 runs it
    (sparkrig/hostpkg.py); its directory must exist.

    + src: local path under files/
    + dest: remote path
    """
    with open(os.path.join(host.state.cwd or "", src), "rb") as f:
        data = f.read()
    yield from owned_put(data, dest, "644", "root", "root")


@dataclass(frozen=True)
class UnitNames:
    """The static sentences naming each operation of an owned unit's lifecycle (``unit_owned``)."""

    install: str
    restart: str
    keep: str
    stop: str
    remove: str


def unit_owned(service: str, dest: str, text: str | None, names: UnitNames) -> None:
    """A unit the deploy owns whole and switches on or off: with ``text``, its file written
    (``dest``), the unit restarted after the file changed and kept running and enabled; with
    None, stopped, disabled and its file removed. Each operation named by ``names``.

    + service: the unit's name
    + dest: its unit file
    + text: the unit file's content, or None where the deploy wants no such unit
    + names: the operations' names
    """
    if text is None:
        unit_state_set(name=names.stop, service=service, running=False, enabled=False)
        file_absent(name=names.remove, path=dest)
        return
    unit = file_present(name=names.install, text=text, dest=dest)
    unit_state_set(
        name=names.restart,
        service=service,
        running=True,
        enabled=True,
        restarted=True,
        daemon_reload=True,
        _if=unit.did_change,
    )
    unit_state_set(name=names.keep, service=service, running=True, enabled=True)
