"""Custom pyinfra operations: idempotent (nothing yielded when nothing must change, ``host.noop``
says why), diff-aware, and taking explicit arguments (never ``host.data``)."""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Callable, Generator, Mapping
from io import BytesIO
from typing import Any

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.operation import OperationMeta
from pyinfra.api.output import format_text
from pyinfra.context import ctx_state
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Command
from pyinfra.operations.util import files as file_utils
from pyinfra.operations.util.files import generate_color_diff

from sparkrig import hoststate
from sparkrig.facts import GidNotFound, select_gid
from sparkrig.gates import gates_passed, parse_gate_lines
from sparkrig.render import render
from sparkrig.runscope import once_per_run


def fail_host(reason: str) -> StringCommand:
    """A command that fails this host (only this one) and prints ``reason`` as the error."""
    return StringCommand("printf", "'%s\\n'", QuoteString(reason), ">&2;", "exit", "1")


@operation(is_idempotent=False)
def refuse(
    problems: list[str],
    heading: str = "preflight failed",
    passed: str = "every preflight check passes",
) -> Generator[Any, None, None]:
    """
    Fail this host with every reason it may not be converged, before anything on it changes.

    + problems: human-readable reasons; empty means the host passes
    + heading: first line of the failure (the reasons follow, one per line)
    + passed: the no-op reason when there is no problem
    """
    if not problems:
        host.noop(passed)
        return
    for problem in problems:
        logger.error(f"{host.print_prefix}{problem}")
    yield fail_host(f"{heading}:\n  " + "\n  ".join(problems))


@operation()
def put_text(
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
    have = hoststate.mine().file(dest)
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
        # Written beside dest, 0600 before a byte lands in it, then renamed over dest in one
        # step: a failed upload leaves the old secret (or none), never an empty or partial one.
        tmp = secret_temp(dest)
        yield StringCommand("install -m 600 -o root -g root /dev/null", QuoteString(tmp))
        yield FileUploadCommand(BytesIO(data), tmp)
        yield StringCommand("mv -f", QuoteString(tmp), QuoteString(dest))
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


@operation()
def owned_directory(
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
    have = hoststate.mine().dir(path)
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
def owned_file_absent(path: str) -> Generator[Any, None, None]:
    """
    Remove a file sparkrig owned (decided from the host's state read).

    + path: remote path
    """
    if hoststate.mine().file(path) is None:
        host.noop(f"file {path} does not exist")
        return
    yield StringCommand("rm", "-f", QuoteString(path))


@operation()
def service(
    service: str,
    running: bool | None = None,
    enabled: bool | None = None,
    restarted: bool = False,
    daemon_reload: bool = False,
) -> Generator[Any, None, None]:
    """
    A systemd unit of this deploy, as ``systemd.service`` does it (same commands and no-op
    reasons), decided from the host's state read instead of two facts per operation.

    + service: unit name (``.service`` added when missing)
    + running: start (True) or stop (False) it; None leaves it
    + enabled: enable (True) or disable (False) it; None leaves it
    + restarted: restart it when it runs
    + daemon_reload: ``systemctl daemon-reload`` first
    """
    name = service if "." in service else f"{service}.service"
    is_running, is_enabled = hoststate.mine().unit(name)
    if daemon_reload:
        yield StringCommand("systemctl", "daemon-reload")
    if running is False:
        if is_running:
            yield StringCommand("systemctl", "stop", QuoteString(name))
        else:
            host.noop(f"service {name} is stopped")
    if running is True:
        if not is_running:
            yield StringCommand("systemctl", "start", QuoteString(name))
        else:
            host.noop(f"service {name} is running")
    if restarted and is_running:
        yield StringCommand("systemctl", "restart", QuoteString(name))
    if enabled is True and not is_enabled:
        yield StringCommand("systemctl", "enable", QuoteString(name))
    elif enabled is False and is_enabled:
        yield StringCommand("systemctl", "disable", QuoteString(name))


@operation()
def rank_env_file(
    dest: str,
    template: str,
    context: Mapping[str, Any],
    fabric_ip: str,
    fabric_interface: str,
    roce_device: str | None = None,
    roce_port: int = 1,
) -> Generator[Any, None, None]:
    """
    Write the rank's env file with the RoCE v2 GID index read from sysfs at this moment.

    On a first run the fabric address is only applied earlier in the same run, so at prepare the
    GID may not exist yet: the diff then shows a placeholder, and the real index is read again
    when the operation executes. No matching GID at execution fails this host with the table.

    + dest: env file path (its directory must exist)
    + template: template under templates/ rendered with ``context`` plus hca and gid_index
    + context: template variables
    + fabric_ip: the rank's fabric IPv4 address
    + fabric_interface: the fabric netdev the GID must belong to
    + roce_device: RDMA device to use; ``None`` detects it from the GID table
    + roce_port: HCA port
    """
    entries = list(hoststate.mine().gids)
    try:
        entry = select_gid(entries, fabric_ip, fabric_interface, roce_device, roce_port)
        hca, index = entry.device, str(entry.index)
    except GidNotFound as err:
        if host.state.is_executing:
            yield fail_host(str(err))
            return
        logger.warning(
            f"{host.print_prefix}no RoCE v2 GID for ::ffff:{fabric_ip} yet; it is read again "
            "after the fabric address is applied"
        )
        hca = roce_device or "<detected after the fabric address is applied>"
        index = "<detected after the fabric address is applied>"
    text = render(template, **context, hca=hca, gid_index=index)
    yield from put_text._inner(text=text, dest=dest, mode="644")


@operation(is_idempotent=False)
def wait_for_ranks(
    bin_dir: str, peers: list[str], port: int, timeout: int
) -> Generator[Any, None, None]:
    """
    Wait until every peer rank's container runs, as its stop-together beacon on the fabric says.

    Gated on real state, not a sleep: the head starts as soon as the workers answer.

    + bin_dir: where sparkrig-pair is installed
    + peers: fabric IPv4 addresses of the ranks to wait for
    + port: beacon port
    + timeout: seconds before giving up (fails this host)
    """
    yield StringCommand(
        f"{bin_dir}/sparkrig-pair",
        "wait",
        "--peers",
        QuoteString(",".join(peers)),
        "--port",
        str(port),
        "--timeout",
        str(timeout),
    )


@operation()
def fabric_path(interface: str, peers: list[str], mtu: int) -> Generator[Any, None, None]:
    """
    Prove every peer answers full-size do-not-fragment pings over the fabric (MTU end to end).

    + interface: the fabric netdev to ping from
    + peers: fabric IPv4 addresses to reach
    + mtu: the fabric MTU; the payload is MTU - 28
    """
    command = ping_command(interface, peers, mtu)
    output = host.get_fact(Command, command=f"{command} 2>&1; echo rc=$?")
    if output and output.rstrip().endswith("rc=0"):
        host.noop(f"{', '.join(peers)} answer {mtu - 28}-byte do-not-fragment pings")
        return
    yield command


@operation()
def displace_claims(
    netplan_files: list[str], nm_profiles: list[str], dest_dir: str
) -> Generator[Any, None, None]:
    """
    Move other configurations of the fabric NIC aside (kept under ``dest_dir`` at their original
    path, to be moved back by hand), so the fabric has one owner.

    + netplan_files: other netplan files naming the fabric NIC
    + nm_profiles: NetworkManager keyfile profiles bound to it (NM forgets them on reload)
    + dest_dir: where they go; nothing under it is read by netplan or NetworkManager
    """
    paths = [*netplan_files, *nm_profiles]
    if not paths:
        host.noop("no other netplan file or NetworkManager profile configures the fabric NIC")
        return
    moves = []
    for path in paths:
        logger.info(f"{host.print_prefix}Will move {path} to {dest_dir}{path}")
        target = shlex.quote(f"{dest_dir}{path}")
        moves.append(f"install -d -m 700 $(dirname {target}) && mv -f {shlex.quote(path)} {target}")
    if nm_profiles:
        moves.append("nmcli connection reload")
    yield " && ".join(moves)


def ping_command(interface: str, peers: list[str], mtu: int) -> str:
    return " && ".join(
        f"ping -M do -s {mtu - 28} -c 2 -W 2 -I {interface} {peer} >/dev/null" for peer in peers
    )


# ---------------------------------------------------------------------------------------------
# Pair restart: one decision for every host of the run
# ---------------------------------------------------------------------------------------------

RESTART_TRIGGERS = {
    "fabric": "the fabric connection was re-applied (MTU reset, address lost)",
    "env": "a rank's env file changed (RoCE GID index, NCCL environment)",
    "weights": "a rank's weights were fetched or copied",
    "rank_unit": "a rank's unit changed (image, serve flags)",
    "pair_unit": "a stop-together unit changed",
    "api_key": "the API key changed (vLLM reads it at start)",
}


class PairRestart:
    """The run's one decision whether the whole pair restarts (in order): any declared trigger
    (``RESTART_TRIGGERS``) changed on any host. Phases hand it the operations that are triggers;
    the service and verify phases gate on it (``_if=restart``), evaluated when they execute."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.metas: dict[str, list[OperationMeta]] = {name: [] for name in RESTART_TRIGGERS}

    def trigger(self, name: str, meta: OperationMeta) -> OperationMeta:
        """Declare ``meta`` (on the current host) as trigger ``name``; returns it."""
        if name not in self.metas:
            raise KeyError(f"{name!r} is not a declared pair-restart trigger ({RESTART_TRIGGERS})")
        self.metas[name].append(meta)
        return meta

    def fired(self) -> list[str]:
        """The triggers whose operation changed something on some host, so far."""
        return [
            name
            for name, metas in self.metas.items()
            if any(m.is_complete() and m.did_change() for m in metas)
        ]

    def __call__(self) -> bool:
        """For ``_if=``: does the pair restart?"""
        return bool(self.fired())


def pair_restart() -> PairRestart:
    """The current run's pair-restart decision (one object for every host and phase)."""
    state = ctx_state.get()
    return once_per_run("pair restart", state, lambda: PairRestart(state))


@operation(is_idempotent=False)
def wait_until_serving(command: list[str]) -> Generator[Any, None, None]:
    """
    Wait for the head's API to boot, failing early when the container dies or logs an error.

    + command: the gate script's ``wait`` argv (prints one JSON line per boot stage)
    """
    yield StringCommand(*[QuoteString(a) for a in command])


@operation()
def serving_gates(command: list[str], acting: bool = True) -> Generator[Any, None, None]:
    """
    Prove the endpoint answers: /health, /v1/models, a math completion and a forced tool call.

    The gates are read like a fact (a completion changes nothing), so a healthy endpoint makes
    this a no-op and a re-run reports no changes; a failing gate fails the head with its detail.

    + command: the gate script's ``gates`` argv (prints one JSON line per gate)
    + acting: False on hosts that only share the operation's place in the order (workers)
    """
    if not acting:
        host.noop("the gates run on the head")
        return
    output = host.get_fact(Command, command=shlex.join(command) + " 2>&1 || true") or ""
    results = parse_gate_lines(output)
    report = "; ".join(f"{r.gate} {'ok' if r.ok else 'FAILED'} ({r.detail})" for r in results)
    if results and gates_passed(results):
        host.noop(f"every gate passes: {report}")
        return
    if not host.state.is_executing:
        logger.info(f"{host.print_prefix}gates before this run: {report or 'no answer'}")
        yield StringCommand(*[QuoteString(a) for a in command])
        return
    yield fail_host(f"serving gates failed: {report or output or 'no answer from the gate script'}")


@operation()
def weights_present(
    fetcher: str,
    lock: str,
    dest: str,
    unit: str,
    source: list[str],
    commit: str,
    total_files: int,
    total_bytes: int,
    source_absent: str = "",
) -> Generator[Any, None, None]:
    """
    Make ``dest`` hold every file of the lockfile, sha256-verified, fetching what is missing.

    The fetch runs as a transient systemd unit, so it survives a dropped SSH session or a
    Ctrl-C of pyinfra; the deploy follows its progress lines and a re-run re-attaches to it.
    Verified files are confirmed by their stamps: a change here is a real fetch (a restart
    trigger); a full re-hash is ``weights_rehashed``, run before this and never a trigger.

    + fetcher: path of sparkrig-fetch on the host
    + lock: lockfile path on the host
    + dest: directory the files land in
    + unit: transient unit name for the fetch
    + source: fetcher arguments naming where bytes come from (``--endpoint``/``--base-url``,
      ``--uplink`` lanes, ``--token-file``)
    + commit: the lockfile's commit; a host lockfile of another commit (a revision bump not
      uploaded yet, at prepare) is judged as "everything may need fetching"
    + total_files: the lockfile's file count, for that summary
    + total_bytes: the lockfile's size, for that summary
    + source_absent: non-empty when the source is not in this run (the head, under --limit
      worker): fail with this as the reason instead of fetching from no one
    """
    state = hoststate.mine().weights_of(lock)
    current = state.ok and state.commit == commit
    if current and state.complete:
        host.noop(f"{dest}: all {state.total_files} files of {commit[:12]} verified")
        return
    summary = (
        state.summary()
        if current
        else f"lockfile {commit[:12]} not judged on the host yet: up to {total_files} files, "
        f"{total_bytes / 1024**3:.2f} GiB"
    )
    if source_absent:
        logger.error(f"{host.print_prefix}{dest}: {summary}; {source_absent}")
        yield fail_host(f"{dest}: {summary}; {source_absent}")
        return
    logger.info(f"{host.print_prefix}{dest}: {summary}")
    fetch = [fetcher, "fetch", "--lock", lock, "--dest", dest, "--verify", "quick", *source]
    yield StringCommand(
        "(systemctl is-active --quiet", QuoteString(unit), "||",
        "systemd-run --quiet --collect --unit", QuoteString(unit),
        *[QuoteString(a) for a in fetch], ") &&",
        QuoteString(fetcher), "follow --unit", QuoteString(unit),
        "--status", QuoteString(f"{dest}.fetch-status.json"),
    )  # fmt: skip


@operation(is_idempotent=False)
def weights_rehashed(fetcher: str, lock: str, dest: str) -> Generator[Any, None, None]:
    """
    Re-hash every file of the lockfile (weights_verify = "full"); a file that fails loses its
    stamp, so ``weights_present`` fetches it again (that fetch, not this, restarts the pair).
    Preflight refuses it beside a serving rank (REFERENCE §5.2: never through the page cache of
    a live pair).

    + fetcher: path of sparkrig-fetch on the host
    + lock: lockfile path on the host
    + dest: directory the files are in
    """
    yield StringCommand(
        QuoteString(fetcher), "verify --mode full --lock", QuoteString(lock),
        "--dest", QuoteString(dest), "||", "echo",
        QuoteString("files failed the re-hash: they are fetched again next"),
    )  # fmt: skip


@operation(is_idempotent=False)
def transient_service(unit: str, command: list[str]) -> Generator[Any, None, None]:
    """
    Run ``command`` as a transient systemd unit (replacing one of the same name).

    + unit: unit name
    + command: argv
    """
    yield StringCommand(
        "systemctl stop", QuoteString(unit), "2>/dev/null;",
        "systemd-run --quiet --collect --unit", QuoteString(unit),
        *[QuoteString(a) for a in command],
    )  # fmt: skip


@operation()
def secret_file(text: str, dest: str) -> Generator[Any, None, None]:
    """
    Own a 0600 root file whose content is never printed (no diff, not in any command line).

    + text: the content
    + dest: remote path (directory must exist)
    """
    yield from owned_put(text.encode(), dest, "600", "root", "root", secret=True)


def secret_temp(dest: str) -> str:
    """Where ``secret_file`` writes a secret before renaming it over ``dest`` (same directory)."""
    return f"{dest}.sparkrig-new"


@operation()
def program(src: str, dest: str) -> Generator[Any, None, None]:
    """
    Install a host-side program from files/ as root, mode 0755 (its directory must exist).

    + src: local path under files/
    + dest: remote path
    """
    with open(os.path.join(host.state.cwd or "", src), "rb") as f:
        data = f.read()
    yield from owned_put(data, dest, "755", "root", "root")


# ---------------------------------------------------------------------------------------------
# Operations some hosts act on: one idiom (every host has them, so all share one sequence)
# ---------------------------------------------------------------------------------------------


@operation()
def acting_where(
    acting: bool, elsewhere: str, op: Any, kwargs: dict[str, Any]
) -> Generator[Any, None, None]:
    """
    ``op`` on the hosts where ``acting`` holds, a no-op elsewhere (saying ``elsewhere``): every
    host has the operation, so pyinfra's barrier orders it the same way on all of them.

    + acting: whether this host acts
    + elsewhere: the no-op reason where it does not
    + op: a sparkrig or pyinfra operation
    + kwargs: its arguments
    """
    if not acting:
        host.noop(elsewhere)
        return
    yield from op._inner(**kwargs)


def _role_op(acting: bool, elsewhere: str, op: Any, name: str, **kwargs: Any) -> OperationMeta:
    global_args = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("_")}
    return acting_where(
        name=name, acting=acting, elsewhere=elsewhere, op=op, kwargs=kwargs, **global_args
    )


def on_head(is_head: bool, op: Any, name: str, **kwargs: Any) -> OperationMeta:
    """The idiom for "only on the head": ``on_head(s.me.is_head, put_text, name=..., ...)``."""
    return _role_op(is_head, "the head alone acts here", op, name, **kwargs)


def on_workers(is_head: bool, op: Any, name: str, **kwargs: Any) -> OperationMeta:
    """The idiom for "only on the workers": ``on_workers(s.me.is_head, op, name=..., ...)``."""
    return _role_op(not is_head, "the workers alone act here", op, name, **kwargs)


HELPERS = {
    "sparkrig-agent": "the worker agent",
    "sparkrig-supervisor": "the pair supervisor",
    "sparkrig-watchdog": "the watchdog",
}


def keep_helper_running(
    unit: str, changed: Callable[[], bool], acting: bool, elsewhere: str
) -> None:
    """Two operations for a sparkrig helper unit (``HELPERS``), named after it and present on
    every host (acting where ``acting`` holds): (re)start it after its unit or program changed,
    and keep it enabled and running otherwise."""
    what = HELPERS[unit]
    _role_op(
        acting,
        elsewhere,
        service,
        name=f"Restart {what} after its unit or program changed",
        service=unit,
        running=True,
        enabled=True,
        restarted=True,
        daemon_reload=True,
        _if=changed,
    )
    _role_op(
        acting,
        elsewhere,
        service,
        name=f"Keep {what} enabled and running",
        service=unit,
        running=True,
        enabled=True,
    )
