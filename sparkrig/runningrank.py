"""The running rank: its part of the state read (its container's state, what its start gate handed
over, the RDMA device now) and what a deploy does when it cannot serve as it is (frozen, its peer
down, its RoCE device or GID index moved under it): each marks the ordered pair restart these
trigger (sparkrig/pairrestart.py)."""

from __future__ import annotations

import shlex
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase, operation
from sparkhost import rankenv
from sparkhost.gid import gid_index

from sparkrig.config.model import Settings
from sparkrig.fabricfacts import RoceGids
from sparkrig.factlines import END, parse_key_values
from sparkrig.stateread import Part, Values, read_here


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
