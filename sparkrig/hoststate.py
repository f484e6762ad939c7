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
  parts the operation asks for (``mine("paths")``), since a first converge changes something at
  nearly every operation and the node, image and weights parts cost seconds each under TCG.

Each part is a ``FactBase``: its command runs inside the script, its ``process`` parses its lines.
A part that exits non-zero fails its host, naming the part. ``read(settings)`` is for task files
(module level, any host of the inventory); operations call ``mine()`` and take no settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.command import QuoteString
from pyinfra.api.exceptions import FactProcessError
from pyinfra.context import ctx_state
from sparkhost.gid import GidEntry

from sparkrig import hostpkg
from sparkrig.factlines import END
from sparkrig.host import SYSCTL_FILE, Node, NodeReport, node_args
from sparkrig.runscope import once_per_run
from sparkrig.settings import Settings

if TYPE_CHECKING:  # the domain modules' operations read this module: imported lazily below
    from sparkrig.owned import PathState
    from sparkrig.weights import WeightsReport

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


@dataclass(frozen=True)
class HostReport:
    """A host's state as the phases read it (see the module docstring)."""

    node: NodeReport = field(default_factory=NodeReport)
    gids: tuple[GidEntry, ...] = ()
    image: Any = None  # sparkrig.image.ImageReport (imported lazily: image reads this module)
    image_args: tuple[tuple[str, Any], ...] = ()
    weights: dict[str, WeightsReport] = field(default_factory=dict)  # by remote lockfile
    files: dict[str, PathState | None] = field(default_factory=dict)
    dirs: dict[str, PathState | None] = field(default_factory=dict)
    running: dict[str, bool] = field(default_factory=dict)  # unit (with .service) -> running
    enabled: dict[str, bool] = field(default_factory=dict)
    pair_secret: str = ""  # the agents' secret installed here (sparkrig/pairsecret.py)
    api_key: str = ""  # the head: the API key installed here ("" elsewhere, or none installed)
    release: Any = None  # sparkrig.release.ReleaseReport: the release record, weights_dir entries

    def file(self, path: str) -> PathState | None:
        if path not in self.files:
            raise KeyError(f"{path} is not in the state read (sparkrig/hoststate.py owned_files)")
        return self.files[path]

    def dir(self, path: str) -> PathState | None:
        if path not in self.dirs:
            raise KeyError(f"{path} is not in the state read (sparkrig/hoststate.py owned_dirs)")
        return self.dirs[path]

    def docker_running(self) -> bool:
        """docker.service and its socket both running, as the units part read them."""
        return all(self.unit(u)[0] for u in DOCKER_UNITS)

    def unit(self, service: str) -> tuple[bool, bool]:
        """(running, enabled) of ``service`` (``.service`` added when missing)."""
        name = service if "." in service else f"{service}.service"
        if name not in self.running:
            raise KeyError(f"{name} is not in the state read (sparkrig/hoststate.py units)")
        return self.running[name], self.enabled.get(name, False)

    def weights_of(self, lock: str) -> WeightsReport:
        if lock not in self.weights:
            raise KeyError(f"{lock} is not in the state read (sparkrig/hoststate.py)")
        return self.weights[lock]

    def repo_tags(self, image_repo: str) -> list[str]:
        """Every ``<image_repo>:<tag>`` on the host (the image part lists them)."""
        if dict(self.image_args).get("image_repo") != image_repo:
            raise KeyError(f"tags of {image_repo} are not in the state read")
        return list(self.image.tags)

    def image_of(self, **args: Any) -> Any:
        if tuple(sorted(args.items())) != self.image_args:
            raise KeyError(f"image state for {args} is not in the state read")
        return self.image


class HostState(FactBase[dict[str, Any]]):
    """Every part of ``parts`` in one read-only remote command (``sh -c``), each parsed by its
    own fact (part key -> value); a part that failed or was cut off fails this host only."""

    default = dict

    def command(self, parts: tuple[Part, ...]) -> StringCommand:
        self._parts = parts  # pyinfra processes the output with the instance that made the command
        return StringCommand("sh", "-c", QuoteString(script(parts)))

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_parts(self._parts, output)


def parse_parts(parts: tuple[Part, ...], lines: list[str]) -> dict[str, Any]:
    """Each part's value (by key) from a state read's output, parsed by the part's own fact."""
    raw = split_output(lines)
    values: dict[str, Any] = {}
    for part in parts:
        if part.key not in raw:
            raise FactProcessError(f"state read: no output for {part.key}")
        rc, body = raw[part.key]
        if rc != 0:
            raise FactProcessError(f"state read: {part.key} failed (exit {rc}): {body[-3:]}")
        values[part.key] = part.parse(body)
    return values


def assemble(parts: tuple[Part, ...], lines: list[str]) -> HostReport:
    """The report from a state read's output: each part parsed by its own fact."""
    return build_report(parts, parse_parts(parts, lines))


def build_report(parts: tuple[Part, ...], values: dict[str, Any]) -> HostReport:
    """The report of ``parts`` from their values (a report holds only the parts it was made of:
    asking it for another part's paths or units raises KeyError)."""
    report: dict[str, Any] = {"weights": {}, "files": {}, "dirs": {}, "running": {}, "enabled": {}}
    for part in parts:
        kind, _, name = part.key.partition(":")
        value = values[part.key]
        if kind == "node":
            report["node"] = value
        elif kind == "gids":
            report["gids"] = tuple(value)
        elif kind == "image":
            report["image"], report["image_args"] = value, part.args
        elif kind == "weights":
            report["weights"][name] = value
        elif kind == "paths":
            for what, asked in part.args:
                unsaid = set(asked) - set(value[what])
                if unsaid:
                    raise FactProcessError(f"state read: nothing said of {unsaid}")
                report[what] = {p: value[what][p] for p in asked}
        elif kind == "units":
            for unit in dict(part.args)["units"]:
                report["running"][unit], report["enabled"][unit] = value.get(unit, (False, False))
        elif kind in ("pair_secret", "api_key"):
            report[kind] = value
        elif kind == "release":
            report["release"] = value
    return HostReport(**report)


# ---------------------------------------------------------------------------------------------
# What a host's read holds
# ---------------------------------------------------------------------------------------------


def owned_files(s: Settings) -> list[str]:
    """Every file the deploy writes whole on this host (a new owned file goes here)."""
    from sparkrig.paths import paths
    from sparkrig.weights import artifacts

    k, p = s.knobs, paths(s)
    files = [
        SYSCTL_FILE,
        *hostpkg.remote_files(k.install_dir),
        k.fabric_netplan_file,
        p["env_file"],
        *(a.remote_lock for a in artifacts(s)),
        p["token_file"],
        p["rank_unit"],
        p["pair_unit"],
        p["pair_token"],
        *hostpkg.legacy_files(k.install_dir),  # removed once the units use the package
    ]
    if s.me.is_head:
        files += [p["restart_script"], p["supervisor_unit"], p["watchdog_unit"]]
        files += [p["api_key"], p["api_key_env"]]  # removed again while api_auth is off
    else:
        files.append(p["agent_unit"])
    return files


def owned_dirs(s: Settings) -> list[str]:
    from sparkrig.paths import paths

    k = s.knobs
    return [
        k.install_dir,
        paths(s)["bin_dir"],
        *hostpkg.remote_dirs(k.install_dir),
        k.config_dir,
        k.weights_dir,
        k.cache_dir,
    ]


DOCKER_UNITS = ("docker.socket", "docker.service")  # docker.io and docker-ce name them alike


def units(s: Settings) -> list[str]:
    """Every unit an operation of any host looks at (each host runs the same operations)."""
    names = [s.unit_name, "sparkrig-pair", "sparkrig-agent", "sparkrig-supervisor"]
    return [f"{n}.service" for n in [*names, "sparkrig-watchdog"]] + list(DOCKER_UNITS)


def parts_of(s: Settings) -> tuple[Part, ...]:
    """The parts of ``s``'s host's state read (the same whoever asks)."""
    from sparkrig.fabric import RoceGids
    from sparkrig.image import ImageState, patched_tag
    from sparkrig.owned import OwnedPaths, UnitStates
    from sparkrig.pairsecret import PairSecretFile
    from sparkrig.paths import paths
    from sparkrig.release import part as release_part
    from sparkrig.weights import WeightsState, artifacts

    k = s.knobs
    parts = [
        Part("node", Node, tuple(sorted(node_args(s).items()))),
        Part("gids", RoceGids),
    ]
    if k.base_image is not None:
        tag = patched_tag(k.base_image, k.image_skip_patches)
        image = {"image_repo": k.image_repo, "base_image": k.base_image, "tag": tag}
        parts.append(Part("image", ImageState, tuple(sorted(image.items()))))
    sparkhost = hostpkg.remote_dir(k.install_dir)
    for a in artifacts(s):
        args = {"sparkhost": sparkhost, "lock": a.remote_lock, "dest": a.dest}
        parts.append(Part(f"weights:{a.remote_lock}", WeightsState, tuple(sorted(args.items()))))
    parts.append(Part("pair_secret", PairSecretFile, (("path", paths(s)["pair_token"]),)))
    if s.me.is_head:  # the API key lives with the head (sparkrig/pairsecret.py api_key)
        parts.append(Part("api_key", PairSecretFile, (("path", paths(s)["api_key"]),)))
    parts.append(release_part(s))
    owned = {"files": tuple(owned_files(s)), "dirs": tuple(owned_dirs(s))}
    parts.append(Part("paths", OwnedPaths, tuple(sorted(owned.items()))))
    parts.append(Part("units", UnitStates, (("units", tuple(units(s))),)))
    return tuple(parts)


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
    changed = 0
    for ops in state.ops.values():
        for data in ops.values():
            meta = data.operation_meta
            if meta.is_complete() and meta.did_change():
                changed += 1
    return ("execute", changed)


def _read(target: Any, parts: tuple[Part, ...], needs: tuple[str, ...] = ()) -> HostReport:
    """The report of ``needs`` (every part when empty), each part read again only when stale.

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
            values = target.get_fact(HostState, parts=tuple(stale))
            reads.count[name] = reads.count.get(name, 0) + 1
            now = _generation(reads.state)
            have.update({p.key: (now, values[p.key]) for p in stale})
        return build_report(wanted, {p.key: have[p.key][1] for p in wanted})


def read(s: Settings) -> HostReport:
    """The state of ``s``'s host (any host of the inventory), read once per generation."""
    from pyinfra.context import ctx_inventory

    return _read(ctx_inventory.get().get_host(s.me.name), parts_of(s))


class NotDeclared(RuntimeError):
    """An operation asked for the state read in a deploy that declares none (uninstall.py)."""


def mine(*needs: str) -> HostReport:
    """Inside an operation: the parts ``needs`` (keys of ``parts_of``: "paths", "units", "image",
    "gids", "release", "weights:<lock>", ...) of the current host's state, declared by its task
    files' ``read``. The report holds those parts only."""
    from pyinfra.context import ctx_host

    target = ctx_host.get()
    parts = _reads().parts.get(target.name)
    if parts is None:
        raise NotDeclared(f"{target.name}: no state read declared (hoststate.read in a task)")
    return _read(target, parts, needs)
