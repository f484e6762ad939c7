"""Serving: the rank unit and what goes into it: the container's run arguments, the engine's serve
flags, the start gate's memory flags and the unit's template context; and the NCCL smoke test's
``docker run`` argv, the rank's own options with one all-reduce.

The serve flags are the selected stack's (sparkrig/stacks/, built by its family's engine:
sparkrig/engines/). The pair's helpers: sparkrig/helperunits.py; the ordered start and the proof
that the pair serves: sparkrig/bringup.py; the running rank: sparkrig/runningrank.py."""

from __future__ import annotations

import re
from typing import Any

from sparkrig import fabricenv, hostpkg, stackfiles, topology
from sparkrig.bringup import starts_in_turn, workers_in_start_order
from sparkrig.config.model import Settings
from sparkrig.engines import engine_of, vllm
from sparkrig.engines.base import ServeRequest
from sparkrig.fabric import graph_volumes
from sparkrig.front import api_key_file
from sparkrig.hardening import container_args, unit_hardening
from sparkrig.paths import paths
from sparkrig.render import base_context

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
