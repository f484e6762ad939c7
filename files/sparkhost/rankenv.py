"""The rank unit's two environment files, each written and read here alone.

``<config_dir>/rank.env``: the rank's environment, written by the deploy (templates/rank.env.j2,
sparkrig.fabric.rank_env_written) and read by the rank unit (``EnvironmentFile=``), its container
(``docker run --env-file``), its start gate (``sparkhost prep --env``, ``read``) and the status
read (``GID_INDEX``, by the shell line ``value_command``).

``/run/sparkrig/gid.env`` (``HANDED_PATH``): the live RoCE v2 GID index the start gate hands to
the container at every rank start (``write_handed``); the unit reads it (``EnvironmentFile=-``,
then ``--env NCCL_IB_GID_INDEX=${SPARKRIG_GID_INDEX}``), and so does the status read.

Both are systemd environment files: ``KEY=VALUE`` lines, ``#`` comments, no quoting. What of
rank.env the start gate reads comes typed (``RankEnv``, ``rank_env``)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

GID_INDEX = "NCCL_IB_GID_INDEX"  # rank.env: the index the deploy saw; the container's name for it
HANDED_PATH = "/run/sparkrig/gid.env"
HANDED = "SPARKRIG_GID_INDEX"  # gid.env: the index the start gate saw at this start
# gid.env: the RDMA device and its kernel index (`rdma dev show`) at this start: a device made
# again (driver reloaded, firmware reset) gets a new index, and the running rank's queue pairs
# died with the old one even when the GID index came back the same
HANDED_DEVICE = "SPARKRIG_ROCE_DEVICE"
HANDED_DEVICE_INDEX = "SPARKRIG_ROCE_DEVICE_INDEX"
# gid.env, fabric_layout "ports": every RDMA device's GID index at this start, "<dev>:<index>,..."
# (the container gets none: NCCL picks each device's RoCE v2 GID by value, docs/rings.md)
HANDED_PER_DEVICE = "SPARKRIG_GID_INDEXES"
# gid.env, fabric_layout "ports": each RDMA device's kernel index at this start, "<dev>:<i>,..."
HANDED_DEVICE_INDEXES = "SPARKRIG_ROCE_DEVICE_INDEXES"


def path(config_dir: str) -> str:
    """Where the deploy writes a rank's env file."""
    return f"{config_dir}/rank.env"


def parse(text: str) -> dict[str, str]:
    """The variables of an environment file (a later line wins, as in systemd)."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            env[key] = value
    return env


def read(path: str) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        return parse(f.read())


# rank.env's keys the start gate reads: the template's (templates/rank.env.j2), and in
# fabric_layout "ports" the lists of every function facing a peer (sparkrig/fabricenv.py)
FABRIC_INTERFACE = "SPARKRIG_FABRIC_INTERFACE"
FABRIC_IP = "SPARKRIG_FABRIC_IP"
FABRIC_MTU = "SPARKRIG_FABRIC_MTU"
ROCE_PORT = "SPARKRIG_ROCE_PORT"
HCA = "NCCL_IB_HCA"
FABRIC_LAYOUT = "SPARKRIG_FABRIC_LAYOUT"
FABRIC_NETDEVS = "SPARKRIG_FABRIC_NETDEVS"
ROCE_DEVICES = "SPARKRIG_ROCE_DEVICES"
FABRIC_ADDRESSES = "SPARKRIG_FABRIC_ADDRESSES"


@dataclass(frozen=True)
class RankEnv:
    """What of rank.env the start gate reads (``rank_env``): the fabric it checks and the GID
    index the deploy saw."""

    interface: str  # the fabric netdev (the single layout's one function)
    ip: str  # its IPv4 address
    mtu: int
    roce_port: int  # every RDMA device's port
    hca: str  # NCCL_IB_HCA: the single layout's RDMA device
    gid_index: int | None = None  # NCCL_IB_GID_INDEX, the index the deploy saw; None: none
    ports: bool = False  # fabric_layout "ports": every function facing a peer, listed below
    netdevs: tuple[str, ...] = ()  # in the env's order, one entry per function in each list
    roce_devices: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()


def rank_env(env: dict[str, str]) -> RankEnv:
    """The typed view of rank.env's variables (``parse``); KeyError names a key it lacks."""
    ports = env.get(FABRIC_LAYOUT) == "ports"
    keys = (FABRIC_NETDEVS, ROCE_DEVICES, FABRIC_ADDRESSES)
    netdevs, devices, addresses = (tuple(env[k].split(",")) if ports else () for k in keys)
    index = env.get(GID_INDEX, "")
    return RankEnv(
        interface=env[FABRIC_INTERFACE],
        ip=env[FABRIC_IP],
        mtu=int(env[FABRIC_MTU]),
        roce_port=int(env[ROCE_PORT]),
        hca=env[HCA],
        gid_index=int(index) if index.isdigit() else None,
        ports=ports,
        netdevs=netdevs,
        roce_devices=devices,
        addresses=addresses,
    )


def read_rank_env(path: str) -> RankEnv:
    return rank_env(read(path))


def handed_text(
    index: int,
    device: str = "",
    device_index: int | None = None,
    per_device: dict[str, int] | None = None,
    device_indexes: dict[str, int] | None = None,
) -> str:
    text = (
        "# Written by sparkrig-prep at the rank's start: the live RoCE v2 GID index\n"
        f"{HANDED}={index}\n"
    )
    if per_device:
        text += f"{HANDED_PER_DEVICE}={format_per_device(per_device)}\n"
    if device_indexes:
        text += f"{HANDED_DEVICE_INDEXES}={format_per_device(device_indexes)}\n"
    if device and device_index is not None:
        text += f"{HANDED_DEVICE}={device}\n{HANDED_DEVICE_INDEX}={device_index}\n"
    return text


def format_per_device(indexes: dict[str, int]) -> str:
    """``{"rocep1s0f1": 3, "roceP2p1s0f1": 5}`` as gid.env's ``rocep1s0f1:3,roceP2p1s0f1:5``."""
    return ",".join(f"{dev}:{index}" for dev, index in indexes.items())


def parse_per_device(value: str) -> dict[str, int]:
    """``format_per_device``'s text back (entries of another shape are left out)."""
    out = {}
    for entry in value.split(","):
        dev, _, index = entry.rpartition(":")
        if dev and index.isdigit():
            out[dev] = int(index)
    return out


def write_handed(
    path: str,
    index: int,
    device: str = "",
    device_index: int | None = None,
    per_device: dict[str, int] | None = None,
    device_indexes: dict[str, int] | None = None,
) -> None:
    """Hand ``index`` over (atomically: the unit never reads half a file), with the RDMA device
    and its kernel index when known, and every device's GID and kernel index (fabric_layout
    "ports")."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(handed_text(index, device, device_index, per_device, device_indexes))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def handed(text: str) -> int | None:
    """The index a gid.env hands over; None when it names none."""
    value = parse(text).get(HANDED, "")
    return int(value) if value.isdigit() else None


def read_handed(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as f:
            return handed(f.read())
    except FileNotFoundError:
        return None


def value_command(key: str, path: str) -> str:
    """A shell pipeline printing the value of ``key`` in the env file at ``path`` (a remote read
    that must stay one command): the last ``KEY=`` line wins, as in ``parse``."""
    return f"sed -n 's/^{key}=//p' {shlex.quote(path)} 2>/dev/null | tail -n 1"


def device_made_again(handed: int | None, live: int | None) -> bool:
    """Whether the RDMA device handed over at a rank's start (its kernel index ``handed``; None:
    none was) is no longer the one there now (``live``; None: gone)."""
    return handed is not None and live != handed


def device_indexes_made_again(handed: dict[str, int], live: dict[str, int]) -> list[str]:
    """The RDMA devices handed over at a rank's start (``handed``: name -> kernel index) that
    are not the ones there now (``live``; a device gone is missing from it)."""
    return [dev for dev, index in handed.items() if live.get(dev) != index]


def live_device_indexes_command(path: str) -> str:
    """A shell line printing ``<dev>:<kernel index>,`` now for every device the gid.env at
    ``path`` handed over per device (the index empty for a device gone)."""
    listed = value_command(HANDED_DEVICE_INDEXES, path)
    show = "rdma dev show \"$d\" 2>/dev/null | sed -n 's/^\\([0-9][0-9]*\\): .*/\\1/p'"
    return (
        f"for e in $({listed} | tr , ' '); do d=${{e%:*}}; "
        f'printf \'%s:%s,\' "$d" "$({show})"; done'
    )


def live_device_index_command(path: str) -> str:
    """A shell line printing the kernel index (``rdma dev show``) the RDMA device handed over in
    the gid.env at ``path`` has now: empty when none was handed over or it is gone."""
    device = value_command(HANDED_DEVICE, path)
    show = "rdma dev show \"$d\" 2>/dev/null | sed -n 's/^\\([0-9][0-9]*\\): .*/\\1/p'"
    return f'd=$({device}); [ -n "$d" ] && {show}'
