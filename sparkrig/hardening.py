"""Least privilege for what sparkrig runs (docs/hardening.md says why each):

- the rank container: no capability but IPC_LOCK (NCCL's RDMA memory registration pins pages,
  docs/hardening.md), NET_BIND_SERVICE only when a port it binds is below 1024,
  ``no-new-privileges``, a pids limit (knob ``container_pids_limit``);
- sparkrig's own units: the systemd sandbox of ``templates/sparkrig-hardening.j2``, per unit from
  ``unit_hardening``: the capabilities it may hold (none but a netfilter unit's CAP_NET_ADMIN and
  a low port's CAP_NET_BIND_SERVICE), what it may write and open, whom it may reach over IP, its
  task and file limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkrig.config.model import Settings

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


# what stdlib Python, systemctl, the docker CLI, rdma and nft open (AF_NETLINK: glibc's address
# lookups, rdma's and nft's netlink); AF_PACKET and the rest stay closed
ADDRESS_FAMILIES = ("AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK")
NETLINK_ONLY = ("AF_UNIX", "AF_NETLINK")  # nft and iptables-nft: the ruleset over netlink


@dataclass(frozen=True)
class UnitHardening:
    """What ``templates/sparkrig-hardening.j2`` writes into a unit's [Service] section; every
    unit also gets NoNewPrivileges, no ambient capabilities, PrivateMounts,
    ProtectKernelModules/Logs, ProtectControlGroups, ProtectHostname,
    RestrictNamespaces/Realtime/SUIDSGID, LockPersonality and native system calls only
    (docs/hardening.md says why each)."""

    protect_system: str  # "strict" (all read-only but write_paths) or "full" (/usr /boot /etc)
    protect_home: str  # "yes", "read-only" (the docker CLI looks for ~/.docker) or "no"
    write_paths: tuple[str, ...] = ()  # ReadWritePaths= beside /run/sparkrig
    ip_allow: tuple[str, ...] | None = None  # None: no IP filter; else IPAddressDeny=any + these
    tasks_max: int | None = 256  # None: systemd's default (a oneshot's few processes)
    nofile: int | None = 4096
    # CapabilityBoundingSet=: all a process of the unit may ever hold, root or not; () none at
    # all (root by its uid alone: the files and sockets it uses are root's)
    caps: tuple[str, ...] = ()
    private_tmp: bool = True
    runtime_dir: bool = True  # RuntimeDirectory=sparkrig (kept when the unit stops)
    private_devices: bool = True  # False: the host's /dev (nvidia-smi opens the GPU's nodes)
    protect_tunables: bool = True  # False: /proc/sys writable (the start gate drops caches)
    # ProtectClock implies DeviceAllow=char-rtc, which closes every other device node
    protect_clock: bool = True
    syscall_filter: bool = True  # SystemCallFilter=@system-service (anything else: SIGSYS)
    deny_write_execute: bool = True  # MemoryDenyWriteExecute= (nothing here writes code)
    address_families: tuple[str, ...] = ADDRESS_FAMILIES


def peers_allow(s: Settings, loopback: bool = False) -> tuple[str, ...]:
    """The addresses a helper talks to: its own and its peers' fabric addresses, every one of
    each rank on a triangle or a ring (a ring of four relays a rank's packets from its own
    address through a neighbour), localhost for one that probes the engine on loopback."""
    ips = sorted(
        {f"{ip}/32" for r in s.ranks for ip in (s.fabric_ips(r) if s.relayed else (r.ip,))}
    )
    return (("localhost",) if loopback else ()) + tuple(ips)


def bind_caps(*ports: int) -> tuple[str, ...]:
    """CAP_NET_BIND_SERVICE for a helper that listens on a port below 1024, else nothing."""
    return ("CAP_NET_BIND_SERVICE",) if min(ports) < PRIVILEGED_BELOW else ()


def unit_hardening(s: Settings, unit: str) -> UnitHardening:
    """The sandbox of one of sparkrig's units: ``rank`` (runs the docker CLI and the start gate,
    talks to the head and peers), ``pair`` (the beacon: docker inspect), ``agent``,
    ``supervisor``, ``watchdog`` (probes the engine on loopback), ``firewall`` (nft) and
    ``relay`` (iptables). None holds a capability beyond what it names in ``caps``."""
    k = s.knobs
    if unit == "rank":
        # the start gate writes /run/sparkrig (gid.env, flags), drops the page cache through
        # /proc/sys/vm and asks nvidia-smi for GPU processes (the GPU's device nodes); the
        # docker CLI reads /root/.docker; the container itself is docker's (container_args)
        return UnitHardening(
            "full", "read-only", tasks_max=512, nofile=65536, private_devices=False,
            protect_tunables=False, protect_clock=False, syscall_filter=False,
        )  # fmt: skip
    if unit == "pair":
        return UnitHardening(
            "strict", "read-only", ip_allow=peers_allow(s), caps=bind_caps(k.pair_port)
        )
    if unit == "watchdog":
        return UnitHardening("strict", "read-only", ip_allow=peers_allow(s, loopback=True))
    if unit in ("agent", "supervisor"):
        return UnitHardening("strict", "yes", ip_allow=peers_allow(s), caps=bind_caps(k.agent_port))
    if unit in ("firewall", "relay"):
        # nft and iptables (its nft backend) change the ruleset over netlink: CAP_NET_ADMIN and
        # no IP at all. The firewall runs before network-pre.target: no private /tmp, which
        # would order it after systemd-tmpfiles-setup.service
        return UnitHardening(
            "strict", "yes", ip_allow=(), tasks_max=None, nofile=None, caps=("CAP_NET_ADMIN",),
            private_tmp=unit == "relay", runtime_dir=False, address_families=NETLINK_ONLY,
        )  # fmt: skip
    raise ValueError(f"no hardening for unit kind {unit!r}")
