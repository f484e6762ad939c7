"""Least privilege for what sparkrig runs (issue 35 item 6; docs/hardening.md says why each):

- the rank container: no capability but IPC_LOCK (NCCL's RDMA memory registration pins pages,
  docs/hardening.md), NET_BIND_SERVICE only when a port it binds is below 1024,
  ``no-new-privileges``, a pids limit (knob ``container_pids_limit``);
- sparkrig's own units: the systemd sandbox of ``templates/sparkrig-hardening.j2``, per unit from
  ``unit_hardening``: what it may write, whom it may reach over IP, its task and file limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkrig.settings import Settings

PRIVILEGED_BELOW = 1024  # ports under this need CAP_NET_BIND_SERVICE to bind (capabilities(7))
CONTAINER_CAPS = ("IPC_LOCK",)  # NCCL/RDMA memlock; nothing else (docs/hardening.md)


def bound_ports(s: Settings) -> list[int]:
    """The TCP ports the rank's engine binds in the container (host network): its own API port
    behind the front (``engine_port``: api_port is nginx's, outside the container) and the
    rendezvous; the smoke test uses the rendezvous + 1."""
    k = s.knobs
    return [k.engine_port, k.master_port, k.master_port + 1]


def container_caps(s: Settings) -> list[str]:
    """``docker run`` options that drop every capability but the ones the rank needs."""
    caps = list(CONTAINER_CAPS)
    if min(bound_ports(s)) < PRIVILEGED_BELOW:
        caps.append("NET_BIND_SERVICE")
    out = ["--cap-drop", "ALL"]
    for cap in caps:
        out += ["--cap-add", cap]
    return out


def container_args(s: Settings) -> list[str]:
    """Every hardening option of a rank's ``docker run`` (the smoke test's too)."""
    return [
        *container_caps(s),
        "--security-opt", "no-new-privileges",
        "--pids-limit", str(s.knobs.container_pids_limit),
    ]  # fmt: skip


@dataclass(frozen=True)
class UnitHardening:
    """What ``templates/sparkrig-hardening.j2`` writes into a unit's [Service] section."""

    protect_system: str  # "strict" (all read-only but write_paths) or "full" (/usr /boot /etc)
    protect_home: str  # "yes", "read-only" (the docker CLI looks for ~/.docker) or "no"
    write_paths: tuple[str, ...] = ()  # ReadWritePaths= beside /run/sparkrig
    ip_allow: tuple[str, ...] | None = None  # None: no IP filter; else IPAddressDeny=any + these
    tasks_max: int = 256
    nofile: int = 4096
    sandbox: bool = True  # the kernel/namespace protections (not for the rank's docker CLI)


def peers_allow(s: Settings, loopback: bool = False) -> tuple[str, ...]:
    """The addresses a helper talks to: its own and its peers' fabric addresses, every one of
    each rank on a triangle or a ring (a ring of four relays a rank's packets from its own
    address through a neighbour), localhost for one that probes the engine on loopback."""
    ips = sorted(
        {f"{ip}/32" for r in s.ranks for ip in (s.fabric_ips(r) if s.relayed else (r.ip,))}
    )
    return (("localhost",) if loopback else ()) + tuple(ips)


def unit_hardening(s: Settings, unit: str) -> UnitHardening:
    """The sandbox of one of sparkrig's units: ``rank`` (runs the docker CLI and the start gate,
    talks to the head and peers), ``pair`` (the beacon: docker inspect), ``agent``,
    ``supervisor``, ``watchdog`` (probes the engine on loopback)."""
    if unit == "rank":
        # the start gate writes /run/sparkrig (gid.env, flags); the container itself is docker's,
        # hardened by container_args; the docker CLI reads /root/.docker
        return UnitHardening("full", "read-only", tasks_max=512, nofile=65536, sandbox=False)
    if unit == "pair":
        return UnitHardening("strict", "read-only", ip_allow=peers_allow(s))
    if unit == "watchdog":
        return UnitHardening("strict", "read-only", ip_allow=peers_allow(s, loopback=True))
    if unit in ("agent", "supervisor"):
        return UnitHardening("strict", "yes", ip_allow=peers_allow(s))
    raise ValueError(f"no hardening for unit kind {unit!r}")
