"""One state read per host: everything the phases decide from, in one remote command.

pyinfra 3.10 does not cache facts: every ``host.get_fact`` runs its command again, whatever its
arguments (pyinfra/api/facts.py ``_get_fact``). A deploy of per-file ``File``/``Sha1File`` facts,
``SystemdStatus`` per operation and the same ``Node`` report in four phases sent 54 commands per
worker for a ``--dry`` of a converged pair. Here every part of a host's state (the node report, the
RoCE GID table, the image and weights state, every owned file's mode, owner and sha256 with every
owned directory, every unit's state) is one *part* of a single shell script, read once and kept.
A part costs processes, not work (each process start is most of a read's time under TCG), so the
owned paths are one part of three processes and the units one ``systemctl show``, whatever their
number (sparkrig/owned.py ``OwnedPaths``, ``UnitStates``):

- while pyinfra prepares (``--dry``, and the module-level code of every run) one read per host,
  whoever asks: the head's look at a worker's image or weights shares the worker's own read;
- while it executes, a part is read again once anything changed on any host since its last
  read (an operation that sent commands), so an operation never decides from a state an earlier
  operation of the run changed. Before the first change every stale part is read at once (after
  a prompt, the whole state once more at the start of execution; with ``-y`` the read made while
  preparing serves, so a ``-y`` no-op reads each host once); after it, only the
  parts the operation asks for (``read_here("paths")``), since a first converge changes something at
  nearly every operation and the node, image and weights parts cost seconds each under TCG.

Each part is a ``FactBase``: its command runs inside the script, its ``process`` parses its lines.
A part that exits non-zero fails its host, naming the part.

This module knows no domain: each domain module declares its own parts (a ``Part`` per fact) and
a typed reader for their values (``Values.get(key, Fact)``); sparkrig/hoststate.py, which only
the tasks import, assembles every domain's parts into a host's read. Operations call ``read_here()``
and take no settings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.command import QuoteString
from pyinfra.api.exceptions import DeployError, FactProcessError
from pyinfra.context import ctx_host, ctx_state

from sparkrig.access import HostLines, first_command_failed
from sparkrig.factlines import END
from sparkrig.runscope import changed, once_per_run

T = TypeVar("T")
PART = "##SPARKRIG-PART"
RC = "##SPARKRIG-RC"

# ---------------------------------------------------------------------------------------------
# The batch: parts, one script, one report
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One fact run inside the state read, under ``key``."""

    key: str
    fact: type[FactBase[Any]]
    args: tuple[tuple[str, Any], ...] = ()

    def __repr__(self) -> str:  # pyinfra logs fact arguments
        return self.key

    def command(self) -> str:
        fact = self.fact()
        kwargs = dict(self.args)
        cmd = fact.command(**kwargs)
        text = cmd.get_raw_value() if isinstance(cmd, StringCommand) else str(cmd)
        needs = fact.requires_command(**kwargs)
        if needs:  # as pyinfra does: no binary, no output, the fact's default
            text = f"if command -v {needs} >/dev/null 2>&1; then ( {text} ); fi"
        return text

    def parse(self, lines: list[str]) -> Any:
        fact = self.fact()
        return fact.process(lines) if lines else fact.default()


def script(parts: tuple[Part, ...]) -> str:
    """The shell script of a state read: each part between its marker and its exit status."""
    chunks = [f"echo '{PART} {p.key}'\n( {p.command()}\n)\necho \"{RC} $?\"" for p in parts]
    return "\n".join([*chunks, f"echo '{END}'"]) + "\n"


def split_script(text: str) -> Iterator[tuple[str, str]]:
    """(key, command) of every part of a state read's script (the fakes answer each part)."""
    for chunk in text.split(f"echo '{PART} ")[1:]:
        key, _, rest = chunk.partition("'\n( ")
        command, _, _ = rest.rpartition(f'\n)\necho "{RC} $?"')
        yield key, command


def split_output(lines: list[str]) -> dict[str, tuple[int, list[str]]]:
    """key -> (exit status, output lines) of every part, from a state read's output."""
    if END not in lines:
        raise FactProcessError("state read ended early (no end marker)")
    parts: dict[str, tuple[int, list[str]]] = {}
    key: str | None = None
    body: list[str] = []
    for line in lines:
        if line.startswith(PART + " "):
            key, body = line[len(PART) + 1 :], []
        elif line.startswith(RC + " ") and key is not None:
            try:
                parts[key] = (int(line[len(RC) + 1 :]), body)
            except ValueError:
                raise FactProcessError(f"state read: bad status line {line!r}") from None
            key = None
        elif key is not None:
            body.append(line)
    return parts


class Values:
    """Parts of one host's state read by key, each value as its own fact made it. A domain's
    typed reader takes its parts from here (``get``); a part not read raises KeyError."""

    def __init__(self, parts: Mapping[str, tuple[Part, Any]]) -> None:
        self._parts = dict(parts)

    def __contains__(self, key: object) -> bool:
        return key in self._parts

    def part(self, key: str) -> Part:
        if key not in self._parts:
            raise KeyError(f"{key} is not in the state read (sparkrig/hoststate.py parts_of)")
        return self._parts[key][0]

    def get(self, key: str, fact: type[FactBase[T]]) -> T:
        """The value of part ``key``, which ``fact`` made (TypeError when another fact did)."""
        part = self.part(key)
        if part.fact is not fact:
            raise TypeError(f"part {key} is read by {part.fact.__name__}, not {fact.__name__}")
        return cast(T, self._parts[key][1])

    def args(self, key: str) -> dict[str, Any]:
        """The arguments part ``key`` was read with."""
        return dict(self.part(key).args)


class HostState(FactBase[dict[str, Any]]):
    """Every part of ``parts`` in one read-only remote command (``sh -c``), each parsed by its
    own fact (part key -> value). A part that failed or was cut off is no exception here: its
    reason comes back under ``FAILED`` and the read fails this host alone, in one line
    (``StateReadFailed``), where pyinfra's own fact error would prompt and end in a traceback."""

    default = dict

    def command(self, parts: tuple[Part, ...]) -> StringCommand:
        self._parts = parts  # pyinfra processes the output with the instance that made the command
        return StringCommand("sh", "-c", QuoteString(script(parts)))

    def process(self, output: list[str]) -> dict[str, Any]:
        try:
            return parse_parts(self._parts, output)
        except FactProcessError as err:
            return {FAILED: f"{err}; check: {check_of(getattr(err, 'part', None))}"}


FAILED = "##failed"  # HostState's value when the read failed: the reason, what to check
CHECK = "`pyinfra INVENTORY deploy.py --dry -vvv` prints the read's command and output"


def check_of(part: Part | None) -> str:
    """What to check when ``part`` (None: the read as a whole) failed: the read is one
    ``sh -c`` over SSH under sudo, and some parts run the host's python3 (sparkrig/hostpkg.py;
    this machinery imports no domain, so the check names python3, not its path)."""
    if part is None:
        return CHECK
    return (
        "SSH to the host as the inventory says (ssh_hostname, ssh_user, ssh_key), sudo for that "
        f"user there (`sudo -v`) and python3 (DGX OS ships it), which its {part.key} part "
        f"needs; {CHECK}"
    )


class StateReadFailed(DeployError):
    """A host's state read failed: one line naming the host, the part and what to check."""


class PartFailed(FactProcessError):
    """One part of a state read failed (``part``: which)."""

    def __init__(self, part: Part, message: str) -> None:
        super().__init__(message)
        self.part = part


def parse_parts(parts: tuple[Part, ...], lines: list[str]) -> dict[str, Any]:
    """Each part's value (by key) from a state read's output, parsed by the part's own fact."""
    raw = split_output(lines)
    values: dict[str, Any] = {}
    for part in parts:
        if part.key not in raw:
            raise PartFailed(part, f"state read: no output for {part.key}")
        rc, body = raw[part.key]
        if rc != 0:
            said = f": {' / '.join(body[-3:])}" if body else ""
            raise PartFailed(part, f"state read: {part.key} failed (exit {rc}){said}")
        try:
            values[part.key] = part.parse(body)
        except FactProcessError as err:
            raise PartFailed(part, f"state read: {part.key}: {err}") from None
    return values


def values_of(parts: tuple[Part, ...], lines: list[str]) -> Values:
    """Every part's value from a state read's output, parsed by the part's own fact."""
    parsed = parse_parts(parts, lines)
    return Values({p.key: (p, parsed[p.key]) for p in parts})


# ---------------------------------------------------------------------------------------------
# Reading once: per host, per generation
# ---------------------------------------------------------------------------------------------


class _Reads:
    """One run's reads: the parts each host was declared with, and each part's last value."""

    def __init__(self, state: Any) -> None:
        import gevent.lock

        self.state = state
        self.parts: dict[str, tuple[Part, ...]] = {}
        self.values: dict[
            str, dict[str, tuple[Any, Any]]
        ] = {}  # host -> key -> (generation, value)
        self.locks: dict[str, Any] = {}
        self.count: dict[str, int] = {}  # host -> reads sent (tests, debug)
        self._lock_type = gevent.lock.Semaphore


def _reads() -> _Reads:
    state = ctx_state.get()
    return once_per_run("state reads", state, lambda: _Reads(state))


def _generation(state: Any) -> Any:
    """Preparing: one read for the whole stage. Executing: a new read once any operation on any
    host sent commands (changed something) since the last one.

    With ``-y`` (pyinfra's ``check_for_changes`` off) execution follows preparation at once, so
    the read made while preparing is execution's first too. Without it the operator reads the
    plan at a prompt for as long as they like, so execution reads again."""
    if not state.is_executing:
        return "prepare" if state.check_for_changes else ("execute", 0)
    metas = (data.operation_meta for ops in state.ops.values() for data in ops.values())
    return ("execute", sum(map(changed, metas)))


def read(target: Any, parts: tuple[Part, ...], needs: tuple[str, ...] = ()) -> Values:
    """The values of ``needs`` (every part when empty), each part read again only when stale.

    Until the first change of the stage (preparing, or executing before any operation changed
    something) every stale part is read at once: one command per host for ``--dry`` and for a
    no-op. After a change only the parts asked for are read: an operation that looks at its
    owned file does not pay for the image, weights and node parts (each of those costs seconds
    under TCG; a first converge changes something at nearly every operation)."""
    reads = _reads()
    name = target.name
    known = reads.parts.setdefault(name, parts)
    if known != parts:
        raise RuntimeError(f"{name}: state read declared with other parts")
    wanted = tuple(p for p in parts if not needs or p.key in needs)
    unknown = set(needs) - {p.key for p in wanted}
    if unknown:
        raise KeyError(f"{name}: {sorted(unknown)} not in the state read (parts_of)")
    lock = reads.locks.setdefault(name, reads._lock_type())
    with lock:
        generation = _generation(reads.state)
        have = reads.values.setdefault(name, {})
        stale = [p for p in parts if have.get(p.key, (None,))[0] != generation]
        if any(p in wanted for p in stale):
            if generation not in ("prepare", ("execute", 0)):
                stale = [p for p in stale if p in wanted]
            with HostLines(target) as printed:  # what the host said, if the command failed
                values = target.get_fact(HostState, parts=tuple(stale), _ignore_errors=True)
            reads.count[name] = reads.count.get(name, 0) + 1
            if not values:  # no part ran: SSH, sudo or the shell failed the command itself
                raise StateReadFailed(f"{name}: {first_command_failed(printed.lines)}") from None
            missing = [p for p in stale if p.key not in values]
            if FAILED in values or missing:
                why = values.get(FAILED) or (
                    f"state read: no output for {missing[0].key}; check: {check_of(missing[0])}"
                )
                raise StateReadFailed(f"{name}: {why}") from None
            now = _generation(reads.state)
            have.update({p.key: (now, values[p.key]) for p in stale})
        return Values({p.key: (p, have[p.key][1]) for p in wanted})


class NotDeclared(RuntimeError):
    """An operation asked for the state read in a deploy that declares none (uninstall.py)."""


def read_here(*needs: str) -> Values:
    """Inside an operation: the parts ``needs`` (keys of sparkrig/hoststate.py ``parts_of``:
    "paths", "units", "image", "gids", "release", "weights:<lock>", ...) of the current host's
    state, declared by its task files' read. The values hold those parts only."""
    target = ctx_host.get()
    parts = _reads().parts.get(target.name)
    if parts is None:
        raise NotDeclared(f"{target.name}: no state read declared (hoststate.read in a task)")
    return read(target, parts, needs)
