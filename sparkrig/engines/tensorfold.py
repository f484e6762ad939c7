"""The TensorFold family: the `tensorfold serve` command line of every rank, as a pure function of
a stack's declaration and typed inputs (the vLLM family's shape: ``engines/vllm.py``).

Every rank runs the same command (TensorFold's CLI: "run the same command on each") with its own
``--rank``: ``tensorfold serve <snapshot> --tp N --rank i --master <head fabric address>
--master-port <stack's port>``, then the stack's flags, the profile's drafter, window and
concurrency, the thinking default, the HTTP flags on rank 0 alone (rank >= 1 never opens HTTP),
and the operator's ``extra_serve_args`` last (argparse keeps the last value of a flag). The
container gets ``argv[1:]`` after ``--entrypoint tensorfold`` (the image has no entrypoint of
its own).

Rank 0 binds loopback: TensorFold 0.6.0 has no API key, so the head's API port is the
authenticating front's, which forwards to ``127.0.0.1:<engine_port>``.

``--tp`` is the rank count, among the stack's ``nodes``: upstream's CLI takes 1 or 2 (the pair's
v1.10 build, stack `tensorfold`); the tp4 branch's N-rank build (stack `tensorfold-ring`) takes
3 and 4 (MiaAI's patches 0066-0068; its nodes.sh ``check_workers``: TP 2, 3 or 4).

On three and more ranks the engine's fabric env is the fabric layer's (``topology.fabric_env``):
``fabric_env_problems`` checks it against what the stack needs; a ring rank's NCCL graph files
are ``engines/nccl.py``'s (NCCL reads them, whichever engine runs it).

``ENGINE`` is the family as an ``Engine`` (sparkrig/engines/base.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sparkrig import topology
from sparkrig.engines.base import ServeRequest
from sparkrig.engines.checks import check_inputs, check_port, check_rank
from sparkrig.engines.nccl import ring_graph_files
from sparkrig.stacks.base import Stack

ENTRYPOINT = "tensorfold"
ENGINE_HOST = "127.0.0.1"  # the engine has no key: only the front on the head reaches it
# Flags the family puts on every rank (tests check each argv carries them).
DISTRIBUTED_FLAGS: tuple[str, ...] = ("--tp", "--rank", "--master", "--master-port")
HTTP_FLAGS: tuple[str, ...] = ("--name", "--host", "--port")  # rank 0 alone


def serve_args(
    stack: Stack,
    profile: str,
    *,
    rank: int,
    nnodes: int,
    master_addr: str,
    master_port: int | None = None,
    model_dir: str,
    engine_port: int = 8001,
    served_name: str = "glm-5.3-flash",
    drafter_dir: str | None = None,
    extra_args: Sequence[str] = (),
    host: str = ENGINE_HOST,
    thinking: bool | None = False,
) -> list[str]:
    """argv of one rank: ``["tensorfold", "serve", SNAPSHOT, flags...]``.

    ``master_port`` None takes the stack's (``Stack.master_port``: TensorFold's 29551).
    ``drafter_dir`` is the DFlash2 snapshot a ``dflash`` profile needs; any other profile passes
    ``--drafter none`` (the checkpoint's MTP head). ``thinking`` None leaves the engine's default
    (thinking on). ``host`` is where rank 0 listens: loopback, behind the front.
    """
    check_rank(
        stack, "tensorfold", rank, nnodes, master_addr, 2, " (TensorFold splits over the pair)"
    )
    if stack.nodes and nnodes not in stack.nodes:
        raise ValueError(
            f"stack {stack.name!r} runs --tp {' or '.join(map(str, stack.nodes))} (its build's "
            f"CLI), not {nnodes}"
        )
    p = stack.profile(profile)
    port = stack.master_port if master_port is None else master_port
    if port is None:
        raise ValueError(f"stack {stack.name!r} declares no master_port and none was given")
    check_port("master_port", port)
    check_port("engine_port", engine_port)
    check_inputs(model_dir, extra_args)
    if p.speculative == "dflash" and not drafter_dir:
        raise ValueError(f"profile {p.name!r} needs the drafter directory")

    args = [ENTRYPOINT, "serve", model_dir]
    args += [
        "--tp", str(nnodes),
        "--rank", str(rank),
        "--master", master_addr,
        "--master-port", str(port),
    ]  # fmt: skip
    args += stack.serve_flags
    args += ["--drafter", drafter_dir if p.speculative == "dflash" and drafter_dir else "none"]
    if p.max_model_len is not None:
        args += ["--context", str(p.max_model_len)]
    if p.max_num_seqs is not None:
        args += ["--parallel", str(p.max_num_seqs)]
    if thinking is not None:
        args += ["--thinking" if thinking else "--no-thinking"]
    if rank == 0:
        args += stack.head_flags
        args += ["--name", served_name, "--host", host, "--port", str(engine_port)]
    args += [str(a) for a in extra_args]
    return args


def run_flags(stack: Stack) -> list[str]:
    """``docker run`` options the recipe gives every rank beyond sparkrig's own, and the
    entrypoint (the image declares none: START runs ``tensorfold serve`` as the command)."""
    return [*stack.run_flags, "--entrypoint", ENTRYPOINT]


def unknown_flags(argv: Sequence[str], known: dict[str, int]) -> list[str]:
    """The options of a ``tensorfold serve`` argv (after ``serve``) that ``known`` (option ->
    nargs: 0 a switch, 1 a value) does not name, as argparse would refuse them; the positional
    snapshot and the options' values are skipped. A value that looks like an option counts as
    one (argparse refuses it too)."""
    words = list(argv)
    if words[:2] == [ENTRYPOINT, "serve"]:
        words = words[2:]
    elif words[:1] == ["serve"]:
        words = words[1:]
    out: list[str] = []
    positional_seen = False
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-"):
            name = w.split("=", 1)[0]
            if name not in known:
                out.append(name)
                i += 1
                continue
            i += 1 + (known[name] if "=" not in w else 0)
            continue
        if positional_seen:
            out.append(w)  # a second positional: argparse's "unrecognized arguments"
        positional_seen = True
        i += 1
    return out


# ---------------------------------------------------------------------------------------------
# Three ranks and more: the fabric env the engine needs
# ---------------------------------------------------------------------------------------------


def hca_devices(value: str) -> list[str]:
    """The device names of an ``NCCL_IB_HCA``/``TF_ROCE_HCA`` value (``=dev:1,dev:1`` or
    ``dev,dev``): the exact-match ``=`` and each ``:port`` left out."""
    return [d.split(":", 1)[0] for d in value.removeprefix("=").split(",") if d]


def fabric_env_problems(
    stack: Stack, nnodes: int, fabric_env: Sequence[tuple[str, str]]
) -> list[str]:
    """What rank's fabric env (``topology.fabric_env``) lacks for ``stack`` on ``nnodes``
    ranks: each value its ``fabric_env_needs`` names, ``TF_ROCE_HCA`` the very devices of
    ``NCCL_IB_HCA``, no ``NCCL_IB_GID_INDEX`` (GID by value), no name set twice, and none the
    stack's own env sets to another value (the rank env file holds both). [] when it fits."""
    env: dict[str, str] = {}
    problems: list[str] = []
    for key, value in fabric_env:
        if key in env:
            problems.append(f"{key} is set twice in the fabric env")
        env[key] = value
    for key, value in stack.fabric_env_needs.get(nnodes, {}).items():
        if env.get(key) != value:
            problems.append(f"{key}={value} needed, the fabric env has {env.get(key)!r}")
    if "NCCL_IB_GID_INDEX" in env:
        problems.append("NCCL_IB_GID_INDEX is pinned; the GID is chosen by value per device")
    if stack.fabric_env_needs.get(nnodes):
        hca, roce = env.get("NCCL_IB_HCA", ""), env.get("TF_ROCE_HCA", "")
        if not hca or hca_devices(roce) != hca_devices(hca):
            problems.append(f"TF_ROCE_HCA {roce!r} is not NCCL_IB_HCA's devices {hca!r}")
    for key, value in stack.at(nnodes).env.items():
        if key in env and env[key] != value:
            problems.append(f"{key}: the stack sets {value!r}, the fabric env {env[key]!r}")
    return problems


class TensorFoldEngine:
    """The TensorFold family as an ``Engine`` (sparkrig/engines/base.py)."""

    family = "tensorfold"
    progress_parser = "tensorfold-health"  # the /health JSON counters

    def run_flags(self, stack: Stack) -> list[str]:
        return run_flags(stack)

    def serve_args(self, stack: Stack, profile: str, request: ServeRequest) -> list[str]:
        return serve_args(stack, profile, **request.fields())

    def rendezvous_port(self, stack: Stack, master_port: int) -> int:
        return stack.master_port or master_port  # the stack's own (29551), else the knob

    def topology_problem(self, stack: Stack, nnodes: int) -> str | None:
        return None  # the build's --tp range is the stack's ``nodes``

    def ring_refusal(self, stack: Stack) -> str:
        return "its ranks' env is not the fabric plan's (it declares no fabric_layout 'ports')"

    def fabric_env_problems(
        self, stack: Stack, nnodes: int, fabric_env: Sequence[tuple[str, str]]
    ) -> list[str]:
        return fabric_env_problems(stack, nnodes, fabric_env)

    def graph_files(self, plan: topology.Plan, rank: int) -> Mapping[str, str]:
        return ring_graph_files(plan, rank)


ENGINE = TensorFoldEngine()
