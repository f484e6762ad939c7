"""Run the real CLI in-process against @fake hosts and read back what reached each host.

Strict: a command no entry of the host's ``fake_responses`` declares fails on the host (pyinfra's
fake would answer it with success and no output) and fails the test, naming the command."""

from __future__ import annotations

import hashlib
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

import pyinfra
import pytest
from click.testing import CliRunner
from pyinfra.connectors.fake import FakeConnector
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_state

from sparkrig import stateread
from sparkrig.factlines import END

# a rank's start prints its journal when it fails (sparkrig/owned.py start_command)
UNIT_ACTION = re.compile(
    r"^systemctl (start|stop|restart) (sparkrig-[\w-]+?)(?:\.service)?(?: \|\| \{ journalctl .*)?$"
)
UNIT_STATE = re.compile(r"--property SubState (sparkrig-[\w-]+?)\.service \)")
RENAME = re.compile(r"^mv -f (/\S+) (/\S+)$")


# A key of a host's fake_responses (never part of a command): every command fails with its value
# on stderr, as sudo fails each one before it runs (``sudo: a password is required``).
SUDO_REFUSES = "##sudo-refuses##"
PATH_LISTS = re.compile(r"for p in (.*?); do ")
UNIT_LIST = re.compile(r"--property UnitFileState (.*?) \); fi$")
Answer = tuple[bool, CommandOutput]


def batched(key: str, command: str, ask: Any) -> Answer | None:
    """The batched parts of the state read (sparkrig/owned.py ``OwnedPaths``, ``UnitStates``)
    answered from the fakes' per-path and per-unit tables, in the batched fact's own output
    format (tests/unit/test_hoststate.py runs the real command): each owned path is asked as
    ``p=<path>; if [ -L `` (fakehosts.owned_of), each unit as pyinfra's ``SystemdStatus`` and
    ``SystemdEnabled`` commands for it alone (fakehosts.unit_fact), so what a test injects for
    one path or unit is what the batched part reports."""
    if key == "paths":
        return _owned_paths(command, ask)
    if key == "units":
        return _unit_states(command, ask)
    return None


def clock_now(declared: Answer | None) -> Answer:
    """A host's clock part: the control machine's time now, plus the skew in seconds a test
    declares for the part's command (fakehosts.CLOCK); none declared: no skew."""
    skew = float(declared[1].stdout_lines[0]) if declared and declared[1].stdout_lines else 0.0
    return True, CommandOutput([OutputLine("stdout", f"{time.time() + skew:.6f}")])


def _owned_paths(command: str, ask: Any) -> Answer:
    dirs, files = (shlex.split(m) for m in PATH_LISTS.findall(command))
    out: list[str] = []
    for section, paths in (("dirs", dirs), ("files", files)):
        out.append(f"{section}:")
        for path in paths:
            ok, said = ask(f"p={shlex.quote(path)}; if [ -L ")
            if not ok:
                return False, said
            words = " ".join(said.stdout_lines).split()
            if not words:
                out.append(f"none {path}")
            elif words[0] in ("link", "other"):
                out.append(f"{words[0]} {path}")
            else:  # "file <mode> <user> <group> <sha256>" or "dir <mode> <user> <group>"
                out.append(" ".join([*words[:4], path]))
                if words[0] == "file":
                    out.append(f"{words[4]}  {path}")
    return True, CommandOutput([OutputLine("stdout", x) for x in out])


def _unit_states(command: str, ask: Any) -> Answer:
    match = UNIT_LIST.search(command)
    assert match, command
    out: list[str] = []
    for unit in shlex.split(match[1]):
        for prop in ("SubState", "UnitFileState"):
            shown = f"systemctl show --all --property Id --property {prop} {unit}"
            ok, said = ask(f"if command -v systemctl >/dev/null 2>&1; then ( {shown} ); fi")
            if not ok:
                return False, said
            out += said.stdout_lines
    return True, CommandOutput([OutputLine("stdout", x) for x in out])


@dataclass
class Run:
    exit_code: int
    output: str
    commands: dict[str, list[str]]
    uploads: dict[str, dict[str, bytes]]
    stdin: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # (command, its stdin)
    # per host: the commands whose output pyinfra was told to print as it came (sparkrig/shown.py)
    shown: dict[str, list[str]] = field(default_factory=dict)
    op_order: list[str] = field(default_factory=list)
    # per host: ops that executed commands (apply) or would change (--dry)
    changed_ops: dict[str, list[str]] = field(default_factory=dict)
    # per host: every operation it has (acting or not), in the run's order
    host_ops: dict[str, list[str]] = field(default_factory=dict)
    exception: BaseException | None = None


def run(
    args: list[str], monkeypatch: Any, fail_upload: str | None = None, stdin: str | None = None
) -> Run:
    """``pyinfra <args>`` as the operator types it; returns commands and uploads per host.
    ``fail_upload``: an upload to a remote path containing it fails (the connection dropped).
    ``stdin``: what the operator types (``"\\n"`` answers the prompt of a run without ``-y``)."""
    from pyinfra_cli.main import cli  # gevent-patches the process: only once a plan test runs

    uploads: dict[str, dict[str, bytes]] = {}

    def put_file(self: FakeConnector, filename_or_io: Any, remote_filename: str, *a: Any, **k: Any):
        if fail_upload is not None and fail_upload in remote_filename:
            return False
        if hasattr(filename_or_io, "read"):
            filename_or_io.seek(0)
            data = filename_or_io.read()
        else:
            with open(filename_or_io, "rb") as f:
                data = f.read()
        if isinstance(data, str):
            data = data.encode()
        uploads.setdefault(self.host.name, {})[remote_filename] = data
        return True

    shell = FakeConnector.run_shell_command
    stdin_seen: dict[str, list[tuple[str, str]]] = {}  # host -> (command, stdin) of each command
    shown: dict[str, list[str]] = {}

    def run_shell_command(self: FakeConnector, command: Any, *a: Any, **k: Any) -> Any:
        """A secret written through stdin (sparkrig/secretio.py) lands in ``uploads`` at its
        destination, as an upload would; ``fail_upload`` fails it."""
        if k.get("print_output"):
            text = command if isinstance(command, str) else command.get_masked_value()
            shown.setdefault(self.host.name, []).append(text)
        fed = k.get("_stdin")
        if fed is None and hasattr(command, "connector_arguments"):
            fed = command.connector_arguments.get("_stdin")
        if fed is not None:
            text = command if isinstance(command, str) else command.get_masked_value()
            stdin_seen.setdefault(self.host.name, []).append((text, fed))
            words = shlex.split(text)
            if words[:2] == ["sh", "-c"] and "/dev/stdin" in words[2]:
                dest = words[4]
                if fail_upload is not None and fail_upload in dest:
                    self.executed_commands.append(text)
                    return False, CommandOutput([OutputLine("stderr", "connection dropped")])
                got = shell(self, command, *a, **k)
                if got[0]:
                    uploads.setdefault(self.host.name, {})[dest] = fed.encode()
                return got
        return shell(self, command, *a, **k)

    undeclared: list[tuple[str, str]] = []
    lookup = FakeConnector._lookup_response
    units: dict[tuple[str, str], str] = {}  # (host, unit) -> SubState after a start or stop

    def answer(self: FakeConnector, command: str) -> tuple[bool, CommandOutput] | None:
        for matcher in self.data.get("fake_responses") or {}:
            if matcher.search(command) if isinstance(matcher, re.Pattern) else matcher in command:
                ok, out = lookup(self, command)
                # systemd remembers: a unit's SubState read after a start or stop reflects it
                acted = UNIT_ACTION.match(command)
                if ok and acted:
                    units[(self.host.name, acted[2])] = acted[1]
                # a rename moves what was uploaded (secret_installed writes a temp file, then mv)
                moved = RENAME.match(command)
                if ok and moved and moved[1] in uploads.get(self.host.name, {}):
                    files = uploads[self.host.name]
                    files[moved[2]] = files.pop(moved[1])
                read = UNIT_STATE.search(command)
                if read and (self.host.name, read[1]) in units:
                    sub = "dead" if units[(self.host.name, read[1])] == "stop" else "running"
                    lines = [f"Id={read[1]}.service", f"SubState={sub}"]
                    out = CommandOutput([OutputLine("stdout", x) for x in lines])
                return ok, out
        return None

    def state_read(self: FakeConnector, command: str) -> tuple[bool, CommandOutput] | None:
        """sparkrig's one state read per host: each part answered as if it ran alone."""
        words = shlex.split(command)
        if words[:2] != ["sh", "-c"] or stateread.PART not in words[2]:
            return None
        lines: list[str] = []
        for key, part in stateread.split_script(words[2]):

            def ask(question: str, key: str = key) -> tuple[bool, CommandOutput]:
                got = answer(self, question)
                if got is None:
                    undeclared.append((self.host.name, f"[state read part {key}] {question}"))
                    got = (False, CommandOutput([]))
                return got

            if key == "clock":
                got = clock_now(answer(self, part))
            else:
                got = batched(key, part, ask) or ask(part)
            lines += [f"{stateread.PART} {key}", *got[1].stdout_lines]
            lines.append(f"{stateread.RC} {0 if got[0] else 1}")
        lines.append(END)
        return True, CommandOutput([OutputLine("stdout", x) for x in lines])

    def strict_lookup(self: FakeConnector, command: str) -> tuple[bool, CommandOutput]:
        refused = (self.data.get("fake_responses") or {}).get(SUDO_REFUSES)
        if refused is not None:
            return False, CommandOutput([OutputLine("stderr", x) for x in refused])
        got = state_read(self, command) or answer(self, command)
        if got is not None:
            return got
        undeclared.append((self.host.name, command))
        return False, CommandOutput([OutputLine("stderr", "undeclared command (tests/plan)")])

    monkeypatch.setattr(FakeConnector, "_lookup_response", strict_lookup)
    monkeypatch.setattr(FakeConnector, "put_file", put_file)
    monkeypatch.setattr(FakeConnector, "run_shell_command", run_shell_command)
    monkeypatch.setattr(pyinfra, "is_cli", True)
    ctx_state.reset()
    result = CliRunner().invoke(
        cli, args, input=stdin, standalone_mode=False, catch_exceptions=True
    )
    state = ctx_state.get() if ctx_state.isset() else None
    commands: dict[str, list[str]] = {}
    op_order: list[str] = []
    changed: dict[str, list[str]] = {}
    host_ops: dict[str, list[str]] = {}
    if state is not None and state.initialised:
        for host in state.inventory:
            conn = host.connector
            if isinstance(conn, FakeConnector):
                commands[host.name] = list(conn.executed_commands)
        for op_hash in state.get_op_order():
            names = state.op_meta[op_hash].names
            op_order.append(next(iter(names)) if names else op_hash)
            for host in state.inventory:
                host_data = state.ops.get(host, {}).get(op_hash)
                if host_data is not None:
                    host_ops.setdefault(host.name, []).append(op_order[-1])
                meta = host_data.operation_meta if host_data is not None else None
                ran = meta is not None and meta._commands
                would = meta is not None and meta._commands is None and meta._maybe_is_change
                if ran or would:
                    changed.setdefault(host.name, []).append(op_order[-1])
    if undeclared:
        listed = "\n".join(f"  {name}: {command[:400]}" for name, command in undeclared)
        pytest.fail(f"commands no fake host declares (tests/plan/fakehosts.py):\n{listed}")
    return Run(
        exit_code=result.exit_code,
        output=result.output,
        commands=commands,
        uploads=uploads,
        stdin=stdin_seen,
        shown=shown,
        op_order=op_order,
        changed_ops=changed,
        host_ops=host_ops,
        exception=result.exception,
    )


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()
