"""Serving: the rank units and what goes into them (container run arguments, vllm serve flags,
template contexts), the stop-together and restart helpers, and the operations that start the
pair in order and prove it serves (beacon wait, boot wait, the five gates).

The gate logic is files/sparkhost/gate.py (its command lines: sparkrig/gates.py); the serve flags
are the selected stack's (sparkrig/stacks/, built by its family's engine: sparkrig/engines/)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.server import Command
from sparkhost import rankenv
from sparkhost.gid import gid_index

from sparkrig import engines, fabricenv, hostpkg, stackfiles, topology
from sparkrig.config.model import Rank, Settings
from sparkrig.engines import engine_of, vllm
from sparkrig.engines.base import ServeRequest
from sparkrig.fabric import RoceGids, graph_volumes
from sparkrig.factlines import END, parse_key_values
from sparkrig.failing import fail_host
from sparkrig.gates import gates_passed, parse_gate_lines, probe_command
from sparkrig.hardening import container_args, unit_hardening
from sparkrig.owned import file_present, unit_state_set
from sparkrig.paths import paths
from sparkrig.render import base_context, render
from sparkrig.shown import ShownCommand
from sparkrig.stateread import Part, Values, read_here

_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_word(arg: str) -> str:
    """Quote one argv element for an ExecStart= line (systemd's own quoting, not the shell's)."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE.match(arg):
        return escaped
    return "'" + escaped.replace("\\", "\\\\").replace("'", "\\'") + "'"


def flag_lines(args: list[str]) -> list[str]:
    """systemd-quoted words, one ``--flag value`` pair (or lone word) per line: readable units."""
    lines: list[str] = []
    i = 0
    while i < len(args):
        word = systemd_word(args[i])
        has_value = i + 1 < len(args) and not args[i + 1].startswith("-")
        if args[i].startswith("-") and has_value:
            word += " " + systemd_word(args[i + 1])
            i += 1
        lines.append(word)
        i += 1
    return lines


def _component(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def jit_cache_dir(cache_dir: str, image: str | None) -> str:
    """The JIT cache directory of one image, cache_dir/<image, made a path component>: a
    changed image retriggers JIT tuning, so sfxnz keys it by image (docs/sources.md, "Image")."""
    if not image:
        return cache_dir
    return f"{cache_dir.rstrip('/')}/{_component(image)}"


def cache_volumes(s: Settings, image: str | None) -> list[str]:
    """``--volume`` options of the caches the stack's rank mounts (``Stack.caches``), each on
    persistent disk under the image's JIT cache directory: a stack with one cache gets that
    directory itself, one with several a subdirectory per container path."""
    base = jit_cache_dir(s.knobs.cache_dir, image)
    caches = list(s.stack.caches)
    out: list[str] = []
    for path in caches:
        host_dir = base if len(caches) == 1 else f"{base}/{_component(path.strip('/'))}"
        out += ["--volume", f"{host_dir}:{path}"]
    return out


def api_key_file(s: Settings) -> str | None:
    """The head's API key file (raw key, 0600 root) for the gates and the watchdog's probe; None
    when the API is open (``api_auth = False``) or on a worker (no API there)."""
    return paths(s).api_key if s.knobs.api_auth and s.me.is_head else None


def api_key_env(key: str) -> str:
    """The 0600 docker env file that gives vLLM its key: VLLM_API_KEY, read by vLLM 0.33's
    ``entrypoints/serve/middleware/register.py`` when no --api-key is given (docs/vllm.md).
    An env file keeps the key out of the unit, the docker and vllm argv and ``ps``."""
    return f"VLLM_API_KEY={key}\n"


def rendezvous_port(s: Settings) -> int:
    """The engine's rendezvous port on the head's fabric address, by the engine's rule (the
    stack's own, as TensorFold's 29551, else the knob master_port)."""
    return engine_of(s.stack).rendezvous_port(s.stack, s.knobs.master_port)


def docker_run_args(
    s: Settings,
    image: str | None = None,
    serving: bool = True,
    env: list[tuple[str, str]] | None = None,
) -> list[str]:
    """``docker run`` options of a rank (docs/sources.md, "Container"), before the image name.
    ``serving``: the engine's container itself (the head's vLLM gets the API key env file), not
    the smoke test; ``env``: these variables instead of the rank's env file (and its graph
    files: a per-link smoke test). The stack's engine's ``run_flags`` come last (its entrypoint
    and, where the engine passes them, the stack's own ``run_flags``)."""
    k, p = s.knobs, paths(s)
    keyed = s.stack.api_auth == "vllm-api-key"
    api_env = ["--env-file", p.api_key_env] if serving and keyed and api_key_file(s) else []
    entry = engine_of(s.stack).run_flags(s.stack)
    args = [
        "--network", "host",
        "--ipc", "host",
        "--device", "/dev/infiniband:/dev/infiniband",
        "--ulimit", "memlock=-1:-1",
        "--ulimit", "stack=67108864",
        *container_args(s),  # --cap-drop ALL --cap-add IPC_LOCK, no-new-privileges, pids
        # no --shm-size: with --ipc host the container uses the host's /dev/shm and Docker does
        # not mount a sized one (podman's docs call the two options conflicting)
        "--memory", k.container_memory,
        "--memory-swap", k.container_memory,
        *(["--env-file", p.env_file] if env is None else
          [w for key, value in env for w in ("--env", f"{key}={value}")]),
        *api_env,
        "--volume", f"{k.weights_dir}:{k.weights_dir}:ro",
        *cache_volumes(s, image),
        *(stackfiles.volumes(s) if serving else []),  # the stack's files (e.g. a chat template)
        # a ring's NCCL graph files, which the env file names (the smoke test too)
        *(graph_volumes(s) if env is None else []),
        *k.container_gpu_args,
        *entry,
    ]  # fmt: skip
    return args


SMOKE_CONTAINER = "sparkrig-nccl-smoke"


def smoke_run_args(s: Settings, image: str, detach: bool = False) -> list[str]:
    """``docker run`` argv of the NCCL smoke test: the rank's own flags and env, one all-reduce
    and the bus bandwidth measurement with its floor (knob fabric_busbw_min_gbs, or
    fabric_ports_busbw_min_gbs in fabric_layout "ports"),
    run by the image's python3 from the host package mounted read-only at its own path (the image
    does not carry it). Detached (workers) keeps the container for ``docker wait``."""
    run = docker_run_args(s, serving=False)
    return smoke_argv(
        s, image, run, detach, s.me.rank, s.nnodes, s.rendezvous_ip, s.busbw_floor_gbs
    )


def link_smoke_run_args(s: Settings, image: str, cable: topology.Cable) -> list[str]:
    """``docker run`` argv of the NCCL smoke test over one cable of a triangle or a ring at
    this rank, one of its two ends (issue 36: the busbw of every link): a pair's smoke test on
    that cable's functions (``fabricenv.link_env``), rank 0 the cable's port-0 end, which runs it
    in the foreground and serves the rendezvous on its primary address there; the port-1 end
    detached (``docker wait`` reads its verdict). The floor is the pair's over both functions
    (fabric_ports_busbw_min_gbs)."""
    k, plan = s.knobs, s.fabric_plan
    assert plan is not None
    env = fabricenv.link_env(plan, s.me.rank, cable.index, k.roce_port)
    run = docker_run_args(s, serving=False, env=env)
    rank = 0 if cable.a.rank == s.me.rank else 1
    master = str(plan.link(cable.index, topology.PRIMARY).address(cable.a.rank).ip)
    return smoke_argv(s, image, run, rank == 1, rank, 2, master, k.fabric_ports_busbw_min_gbs)


def function_smoke_run_args(s: Settings, image: str, function: int) -> list[str]:
    """``docker run`` argv of the NCCL smoke test of a pair on both functions over one function
    alone (``fabricenv.function_env``), at the rank's own place in the pair (the head in the
    foreground, the worker detached) and held to one function's floor (fabric_busbw_min_gbs)."""
    k, plan = s.knobs, s.fabric_plan
    assert plan is not None
    env = fabricenv.function_env(plan, s.me.rank, function, k.roce_port)
    run = docker_run_args(s, serving=False, env=env)
    return smoke_argv(
        s, image, run, not s.me.is_head, s.me.rank, 2, s.rendezvous_ip, k.fabric_busbw_min_gbs
    )


def smoke_argv(
    s: Settings,
    image: str,
    run: list[str],
    detach: bool,
    rank: int,
    world_size: int,
    master: str,
    floor_gbs: float,
) -> list[str]:
    """The smoke test's ``docker run`` argv from the rank's options ``run`` (docker_run_args,
    cut before its entrypoint): rank ``rank`` of ``world_size`` meeting at ``master`` on
    master_port + 1, the host package's nccl-smoke with the knobs' sizes and ``floor_gbs``."""
    k = s.knobs
    package = hostpkg.remote_dir(k.install_dir)
    run = run[: run.index("--entrypoint")]
    return [
        "docker", "run", "--detach" if detach else "--rm", "--name", SMOKE_CONTAINER, *run,
        "--env", f"RANK={rank}", "--env", f"WORLD_SIZE={world_size}",
        "--env", f"MASTER_ADDR={master}", "--env", f"MASTER_PORT={k.master_port + 1}",
        "--volume", f"{package}:{package}:ro",
        "--entrypoint", "python3", image,
        package, "nccl-smoke", "--timeout", str(k.nccl_smoke_timeout_s),
        "--bytes", str(k.nccl_smoke_bytes), "--warmup", str(k.nccl_smoke_warmup),
        "--iters", str(k.nccl_smoke_iters), "--min-busbw-gbs", f"{floor_gbs:g}",
    ]  # fmt: skip


def rank_serve_args(s: Settings) -> list[str]:
    """The rank's engine argv after the entrypoint's program, from the stack's engine."""
    k, p = s.knobs, paths(s)
    request = ServeRequest(
        rank=s.me.rank,
        nnodes=s.nnodes,
        master_addr=s.rendezvous_ip,
        master_port=rendezvous_port(s),
        model_dir=p.model_dir,
        engine_port=k.engine_port,  # the engine on the head's loopback; the front serves api_port
        served_name=k.served_model_name,
        drafter_dir=p.drafter_dir if s.needs_drafter else None,
        extra_args=k.extra_serve_args,
        thinking=k.thinking_default,
    )
    argv = engine_of(s.stack).serve_args(s.stack, k.profile, request)
    return argv[1:]  # the entrypoint's program (run_flags' --entrypoint)


def memory_floor_gib(s: Settings) -> float | None:
    """The start gate's pinned memory bound: the knob memfree_min_gib, else the stack's
    (``Stack.memory.floor_gib``); None: derived on the node from the utilization. The knob is
    a floor of free memory, so a stack whose gate is a ceiling on *used* memory (Entrpi's 6 GB
    preflight) keeps its own ceiling: a free-memory floor read as a used-memory ceiling would
    refuse every start (0.2 GiB free floor -> 0.2 GiB used ceiling)."""
    k, gate = s.knobs, s.stack.memory
    if gate.measure == "used":
        return gate.floor_gib
    return k.memfree_min_gib if k.memfree_min_gib is not None else gate.floor_gib


def gpu_memory_utilization(s: Settings) -> str:
    """The --gpu-memory-utilization the rank's engine starts with (the floor's input)."""
    return vllm.gpu_memory_utilization(rank_serve_args(s))


def memory_gate_args(s: Settings) -> str:
    """sparkrig-prep's memory flags: the floor vLLM's start check implies (the rank's own
    --gpu-memory-utilization x MemTotal + margin, read on the node) unless memfree_min_gib or the
    stack pins one; what the stack's gate measures when it is not MemFree; and the rank's
    container, which is not a foreign memory holder."""
    k = s.knobs
    args = ["--gpu-memory-utilization", gpu_memory_utilization(s),
            "--memfree-margin-gib", f"{k.memfree_margin_gib:g}",
            "--container", s.container_name]  # fmt: skip
    floor = memory_floor_gib(s)
    if floor is not None:
        args += ["--memfree-min-gib", f"{floor:g}"]
    if s.stack.memory.measure != "memfree":
        args += ["--memory-measure", s.stack.memory.measure]
    return " ".join(args)


def weights_id(s: Settings) -> str:
    """What the rank unit's header says it serves: ``repo@revision`` of the model, and of the
    drafter when the profile loads it."""
    said = f"{s.model.repo}@{s.model.revision}"
    if s.needs_drafter and s.drafter is not None:
        said += f" + {s.drafter.repo}@{s.drafter.revision}"
    return said


def rank_unit_context(s: Settings, image: str, weights_id: str) -> dict[str, Any]:
    k = s.knobs
    return {
        **base_context(s),
        "image": image,
        "weights_id": weights_id,
        "run_args": flag_lines(docker_run_args(s, image)),
        "serve_args": flag_lines(rank_serve_args(s)),
        "memory_gate_args": memory_gate_args(s),
        "memfree_wait_s": k.memfree_wait_s,
        "fabric_wait_s": k.fabric_wait_s,
        # one GID index handed to the container (single layout); fabric_layout "ports" hands
        # none: NCCL picks each device's RoCE v2 GID by value (NCCL_IB_ADDR_RANGE, docs/rings.md)
        "pin_gid_index": s.fabric_plan is None,
        # the head's start gate waits for (and asks) the workers in the stack's start order
        "peers": ",".join(map(s.dial, workers_in_start_order(s) if s.me.is_head else s.peers)),
        "in_turn": starts_in_turn(s),
        "head_ip": s.dial(s.head),
        "pair_port": k.pair_port,
        "pair_grace_s": k.pair_grace_s,
        "agent_port": k.agent_port,
        # the start gate may wait memfree_wait_s twice: a dead engine's memory, then the floor
        "start_timeout_s": k.fabric_wait_s + k.pair_grace_s + 2 * k.memfree_wait_s + 120,
        "hardening": unit_hardening(s, "rank"),
    }


def pair_unit_context(s: Settings) -> dict[str, Any]:
    k = s.knobs
    return {
        **base_context(s),
        "peers": ",".join(map(s.dial, s.peers)),
        "pair_port": k.pair_port,
        "pair_grace_s": k.pair_grace_s,
        "hardening": unit_hardening(s, "pair"),
    }


def restart_args(s: Settings) -> str:
    k = s.knobs
    return " ".join(
        [
            "--head-unit", f"{s.head_unit_name}.service",
            "--workers", ",".join(map(s.dial, workers_in_start_order(s))),
            "--port", str(k.pair_port),
            "--agent-port", str(k.agent_port),
            "--token-file", paths(s).pair_token,
            *(["--in-turn"] if starts_in_turn(s) else []),  # one worker at a time, in that order
        ]
    )  # fmt: skip


def agent_unit_context(s: Settings) -> dict[str, Any]:
    return {
        **base_context(s),
        "agent_port": s.knobs.agent_port,
        "token_file": paths(s).pair_token,
        "hardening": unit_hardening(s, "agent"),
    }


def progress_url(s: Settings) -> str:
    """What the watchdog reads for progress (``Stack.progress_path``): the engine on its own
    loopback port, behind the API front (vLLM's /metrics and TensorFold's /health need no key)."""
    return f"http://127.0.0.1:{s.knobs.engine_port}{s.stack.progress_path}"


def watchdog_unit_context(s: Settings) -> dict[str, Any]:
    k = s.knobs
    return {
        **base_context(s),
        "restart_args": restart_args(s),
        # the watchdog judges the engine itself, on its loopback port (not through the API
        # front: a front down is not a wedged engine, and restarting the pair would not fix it)
        "probe": shlex.join(
            probe_command(
                k.install_dir, k.engine_port, k.served_model_name, key_file=api_key_file(s)
            )
        ),
        "health_url": f"http://127.0.0.1:{k.engine_port}/health",
        "metrics_url": progress_url(s),
        "progress_parser": engines.progress_parser(s.stack),
        "stall": k.watchdog_stall_s,
        "interval": k.watchdog_interval_s,
        "fails": k.watchdog_fails,
        "grace": k.watchdog_grace_s,
        "max_restarts": k.watchdog_max_restarts,
        "window": k.watchdog_window_s,
        "hardening": unit_hardening(s, "watchdog"),
    }


def supervisor_unit_context(s: Settings) -> dict[str, Any]:
    k = s.knobs
    return {
        **base_context(s),
        "restart_args": restart_args(s),
        "agent_port": k.agent_port,
        "max_restarts": k.supervisor_max_restarts,
        "window": k.supervisor_window_s,
        "hardening": unit_hardening(s, "supervisor"),
    }


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


def worker_waves(s: Settings) -> list[tuple[int, ...]]:
    """The workers' part of the stack's start order (``Stack.start_waves``): one tuple per step,
    each started and seen running before the next; the head starts after the last."""
    return [w for w in s.stack.start_waves(s.nnodes) if 0 not in w]


def workers_in_start_order(s: Settings) -> list[Rank]:
    """Every worker in the order the stack starts them (``worker_waves``)."""
    return [s.ranks[r] for wave in worker_waves(s) for r in wave]


def starts_in_turn(s: Settings) -> bool:
    """True when the workers start one step at a time (more than one worker wave)."""
    return len(worker_waves(s)) > 1


def worker_wait_args(s: Settings, ranks: Sequence[int] | None = None) -> dict[str, Any]:
    """``workers_running``'s arguments for the head waiting on ``ranks`` (default every worker;
    ordered start and rollback alike)."""
    k = s.knobs
    waited = s.workers if ranks is None else tuple(s.ranks[r] for r in ranks)
    return {
        "sparkhost": hostpkg.invocation(k.install_dir),
        "peers": [s.dial(w) for w in waited],
        "port": k.pair_port,
        "timeout": k.pair_grace_s,
        "explain": why_command(s),
    }


def why_command(s: Settings) -> list[str]:
    """argv of ``sparkhost why`` on this rank (files/sparkhost/why.py): what the firewall dropped
    on the fabric and from whom, the fabric addresses, the GID handed over, the peers' beacons
    and the rank's last journal lines; appended to a failed boot wait or rendezvous."""
    return hostpkg.command(
        s.knobs.install_dir, "why", "--unit", f"{s.unit_name}.service",
        "--interface", s.me.fabric_interface, "--peers", ",".join(s.dial(r) for r in s.others),
        "--port", str(s.knobs.pair_port),
    )  # fmt: skip


def explained(command: Sequence[str], explain: Sequence[str] | None) -> StringCommand:
    """``command``, its lines shown as they come (a boot's stages); when it fails, ``explain``
    runs after it (its lines in the failure's output) and the exit status stays the command's."""
    if not explain:
        return ShownCommand(*[QuoteString(a) for a in command])
    script = f"{shlex.join(command)} || {{ rc=$?; {shlex.join(explain)}; exit $rc; }}"
    return ShownCommand("sh", "-c", QuoteString(script))


# ---------------------------------------------------------------------------------------------
# The running rank: its part of the state read, and what a deploy does when it cannot serve
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankRuntimeReport:
    """What the rank running on a node holds now (read while its unit may be active)."""

    container: str = ""  # docker's State.Status of the rank's container; "" when there is none
    handed_gid: int | None = None  # the GID index its start gate handed over (None: no start yet)
    handed_device_index: int | None = None  # its RDMA device's kernel index at that start
    live_device_index: int | None = None  # that device's kernel index now (None: gone)
    # fabric_layout "ports": every RDMA device's GID index and kernel index at that start, and
    # each one's kernel index now (a device gone is missing)
    handed_gids: dict[str, int] = field(default_factory=dict)
    handed_device_indexes: dict[str, int] = field(default_factory=dict)
    live_device_indexes: dict[str, int] = field(default_factory=dict)


def _int(value: str) -> int | None:
    return int(value) if value.isdigit() else None


class RankRuntime(FactBase[RankRuntimeReport]):
    """
    The rank's container state (``docker inspect``, bounded: a daemon that hangs answers ""),
    what its start gate handed over (``/run/sparkrig/gid.env``: the RoCE GID index, the RDMA
    device and its kernel index) and that device's kernel index now (``rdma dev show``).
    """

    default = RankRuntimeReport

    def command(self, container: str, handed_path: str) -> str:
        q = shlex.quote
        inspect = f"timeout 20 docker inspect --format '{{{{.State.Status}}}}' {q(container)}"
        device_index = rankenv.value_command(rankenv.HANDED_DEVICE_INDEX, handed_path)
        live = rankenv.live_device_index_command(handed_path)
        handed_gids = rankenv.value_command(rankenv.HANDED_PER_DEVICE, handed_path)
        device_indexes = rankenv.value_command(rankenv.HANDED_DEVICE_INDEXES, handed_path)
        live_indexes = rankenv.live_device_indexes_command(handed_path)
        return (
            f'echo "container=$({inspect} 2>/dev/null)"; '
            f'echo "handed=$({rankenv.value_command(rankenv.HANDED, handed_path)})"; '
            f'echo "device_index=$({device_index})"; '
            f'echo "live_device_index=$({live})"; '
            f'echo "handed_gids=$({handed_gids})"; '
            f'echo "device_indexes=$({device_indexes})"; '
            f'echo "live_device_indexes=$({live_indexes})"; '
            f"echo '{END}'"
        )

    def process(self, output: list[str]) -> RankRuntimeReport:
        raw = parse_key_values(output, "rank runtime")
        return RankRuntimeReport(
            container=raw.get("container", ""),
            handed_gid=_int(raw.get("handed", "")),
            handed_device_index=_int(raw.get("device_index", "")),
            live_device_index=_int(raw.get("live_device_index", "")),
            handed_gids=rankenv.parse_per_device(raw.get("handed_gids", "")),
            handed_device_indexes=rankenv.parse_per_device(raw.get("device_indexes", "")),
            live_device_indexes=rankenv.parse_per_device(raw.get("live_device_indexes", "")),
        )


def rank_part(s: Settings) -> Part:
    """The state read's part of the running rank."""
    return Part(
        "rank", RankRuntime, (("container", s.container_name), ("handed_path", rankenv.HANDED_PATH))
    )


def rank_of(values: Values) -> RankRuntimeReport:
    """The rank part of ``values`` (a report of nothing running when it was not read)."""
    return values.get("rank", RankRuntime) if "rank" in values else RankRuntimeReport()


@operation()
def rank_thawed(container: str, running: bool) -> Generator[Any, None, None]:
    """
    Thaw a running rank's container that ``docker pause`` froze; the ordered pair restart this
    triggers follows (its NCCL peers may have timed out while it was frozen).

    + container: the rank's container
    + running: whether the rank's unit is active (a stopped rank is started anyway)
    """
    state = rank_of(read_here("rank")).container
    if not running or state != "paused":
        host.noop(f"{container} is not frozen ({state or 'no container'})")
        return
    logger.info(
        f"{host.print_prefix}{container} is frozen (docker pause): thawed, then the pair restarts"
    )
    yield f"docker unpause {shlex.quote(container)}"


@operation()
def peer_down_marked(
    unit: str, running: bool, down_peers: list[str], run_dir: str
) -> Generator[Any, None, None]:
    """
    Mark a running rank whose peer's rank is down (dead or failed, not starting) for the ordered
    pair restart this triggers: a rank started alone cannot join an engine that already runs, so
    the pair goes down and comes up whole. The mark (the pair-down flag the helpers read) says
    the stop that follows is sparkrig's own, not an operator's.

    + unit: this rank's unit
    + running: whether this rank's unit is active
    + down_peers: the ranks of this run whose units are down
    + run_dir: where the helpers' flags live (/run/sparkrig)
    """
    if not running or not down_peers:
        host.noop(f"{unit} is not serving beside a rank that is down")
        return
    why = f"{', '.join(down_peers)} down while {unit} ran: the pair restarts in order"
    logger.info(f"{host.print_prefix}{why}")
    flag = f"{run_dir}/pair-down"
    yield f"mkdir -p {shlex.quote(run_dir)} && echo {shlex.quote(why)} > {shlex.quote(flag)}"


@operation()
def stale_gid_dropped(
    fabric_ip: str,
    fabric_interface: str,
    running: bool,
    roce_device: str | None = None,
    roce_port: int = 1,
    functions: Sequence[tuple[str, str, str]] = (),
) -> Generator[Any, None, None]:
    """
    Drop what the start gate handed to a running rank when the live RoCE device no longer
    matches it: the GID index moved (the table renumbered under the rank) or the RDMA device was
    made again (a new kernel index: a driver reload, a firmware reset; the rank's queue pairs died
    with the old device even when the index came back the same). The ordered pair restart this
    triggers hands the live ones over.

    + fabric_ip: the rank's fabric IPv4 address
    + fabric_interface: the fabric netdev
    + running: whether the rank's unit is active (a stopped rank reads both at its start)
    + roce_device: RDMA device to use; ``None`` detects it from the GID table
    + roce_port: HCA port
    + functions: fabric_layout "ports": (netdev, RDMA device, IPv4) of every function; each
      device the start gate handed over is judged alike (its GID found by value)
    """
    rank = rank_of(read_here("rank"))
    gids = read_here("gids").get("gids", RoceGids)
    # a GID not found reads None here: the fabric phase fails this host, naming the table
    said: list[str] = []
    live = gid_index(gids, fabric_ip, fabric_interface, roce_device, roce_port)
    if rank.handed_gid is not None and live is not None and rank.handed_gid != live:
        said.append(f"RoCE GID index {rank.handed_gid}, the live table {live}")
    if rankenv.device_made_again(rank.handed_device_index, rank.live_device_index):
        now = rank.live_device_index if rank.live_device_index is not None else "gone"
        said.append(f"RDMA device index {rank.handed_device_index}, the device now {now}")
    for netdev, device, ip in functions:
        handed = rank.handed_gids.get(device)
        index = gid_index(gids, ip, netdev, device, roce_port)
        if handed is not None and index is not None and handed != index:
            said.append(f"RoCE GID index {handed} on {device}, the live table {index}")
    for device in rankenv.device_indexes_made_again(
        rank.handed_device_indexes, rank.live_device_indexes
    ):
        now = rank.live_device_indexes.get(device, "gone")
        said.append(
            f"{device} at RDMA device index {rank.handed_device_indexes[device]}, now {now}"
        )
    if not running:
        host.noop("the rank is not running: its start hands the live RoCE device and GID over")
        return
    if not said:
        host.noop(f"the running rank has the live RoCE device and GID index ({live})")
        return
    logger.info(f"{host.print_prefix}the running rank has {'; '.join(said)}: the pair restarts")
    yield f"rm -f {shlex.quote(rankenv.HANDED_PATH)}"


@operation(is_idempotent=False)
def workers_running(
    sparkhost: list[str],
    peers: list[str],
    port: int,
    timeout: int,
    explain: list[str] | None = None,
) -> Generator[Any, None, None]:
    """
    Wait until every peer rank's container runs, as its stop-together beacon on the fabric says.

    Gated on real state, not a sleep: the head starts as soon as the workers answer.

    + sparkhost: argv of the host package (sparkrig/hostpkg.py invocation)
    + peers: fabric IPv4 addresses of the ranks to wait for
    + port: beacon port
    + timeout: seconds before giving up (fails this host)
    + explain: argv run when the wait fails, saying why (``why_command``)
    """
    wait = [*sparkhost, "pair", "wait", "--peers", ",".join(peers), "--port", str(port),
            "--timeout", str(timeout)]  # fmt: skip
    yield explained(wait, explain)


@operation(is_idempotent=False)
def api_serving(command: list[str], explain: list[str] | None = None) -> Generator[Any, None, None]:
    """
    Wait for the head's API to boot, failing early when the container dies or logs an error.

    + command: the gate script's ``wait`` argv (prints one JSON line per boot stage)
    + explain: argv run when the wait fails, saying why (``why_command``): a failing start never
      ends on "container not running" alone
    """
    yield explained(command, explain)


@operation()
def serving_gates_passed(command: list[str], logs: str) -> Generator[Any, None, None]:
    """
    Prove the endpoint answers: /health, /v1/models, a math completion and a forced tool call.

    The gates are read like a fact (a completion changes nothing), so a healthy endpoint makes
    this a no-op and a re-run reports no changes; a failing gate fails the head with its detail.

    + command: the gate script's ``gates`` argv (prints one JSON line per gate)
    + logs: where to read why, appended to a failure (``logs_to_read``)
    """
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
    said = report or output.strip() or "no answer from the gate script"
    yield fail_host(f"serving gates failed: {said}; {logs}")


def logs_to_read(s: Settings) -> str:
    """Where an operator reads why this rank does not serve: its unit and its container."""
    return (
        f"read why on {s.me.name}: `sudo journalctl -u {s.unit_name} -n 200` (the serving "
        f"unit) and `sudo docker logs --tail 200 {s.container_name}` (vLLM)"
    )


def role_template(
    on_role: Callable[..., OperationMeta],
    is_head: bool,
    name: str,
    template: str,
    context: Mapping[str, Any],
    dest: str,
    mode: str = "644",
) -> OperationMeta:
    """A file rendered from ``templates/<template>`` and owned whole on the head or on the workers
    alone (``on_role``: ``on_head`` or ``on_workers``), an operation on every host.

    + on_role: sparkrig.ordering's on_head or on_workers
    + is_head: whether this host is the head
    + name: the operation's name
    + template: template under templates/
    + context: its variables
    + dest: remote path (its directory must exist)
    + mode: octal permissions
    """
    text = render(template, **context)
    return on_role(is_head, file_present, name=name, text=text, dest=dest, mode=mode)


HELPERS = {
    "sparkrig-agent": "the worker agent",
    "sparkrig-supervisor": "the pair supervisor",
    "sparkrig-watchdog": "the watchdog",
}


def keep_helper_running(
    on_role: Callable[..., OperationMeta], is_head: bool, unit: str, changed: Callable[[], bool]
) -> None:
    """Two operations for a sparkrig helper unit (``HELPERS``), named after it (so the log tells
    the helpers apart) and present on every host, acting on the head or the workers alone
    (``on_role``: ``on_head`` or ``on_workers``): (re)start it after its unit or program changed,
    and keep it enabled and running otherwise."""
    what = HELPERS[unit]
    on_role(
        is_head,
        unit_state_set,
        name=f"Restart {what} after its unit or program changed",
        service=unit,
        running=True,
        enabled=True,
        restarted=True,
        daemon_reload=True,
        _if=changed,
    )
    on_role(
        is_head,
        unit_state_set,
        name=f"Keep {what} enabled and running",
        service=unit,
        running=True,
        enabled=True,
    )
