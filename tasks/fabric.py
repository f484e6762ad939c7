"""Phase 3, fabric: the QSFP NIC's netplan file (static address, MTU 9000, rendered by
NetworkManager as on DGX OS), applied to the fabric connection alone when it or the live link
drifted, proved with do-not-fragment pings between every pair of ranks; then the rank's env file
with the RoCE v2 GID index read from sysfs."""

from pyinfra.operations import server

from sparkrig import hoststate
from sparkrig.fabric import (
    claims_displaced_args,
    env_context,
    fabric_addresses_owned,
    fabric_claims_displaced,
    fabric_link_raised,
    fabric_path_proven,
    rank_env_written,
    roce_device_present,
)
from sparkrig.owned import file_present
from sparkrig.pairrestart import pair_restart
from sparkrig.paths import paths
from sparkrig.render import base_context, render
from sparkrig.settings import current

settings = current()
knobs = settings.knobs
iface, address = settings.me.fabric_interface, settings.me.fabric_address.with_prefixlen
node = hoststate.read(settings).node

# preflight refused these unless fabric_takeover is set
takeover = fabric_claims_displaced(
    name="Move other configurations of the fabric NIC aside (fabric_takeover)",
    **claims_displaced_args(settings, node),
)
netplan = file_present(
    name="Persist the fabric address and MTU with netplan",
    text=render(
        "netplan-fabric.yaml.j2", **base_context(settings), address=address, mtu=knobs.fabric_mtu
    ),
    dest=knobs.fabric_netplan_file,
    mode="600",
)
# sparkrig owns the link: one that is administratively down is brought up (then re-applied)
link_up = fabric_link_raised(
    name="Bring the fabric link up when it is administratively down",
    interface=iface,
    admin_up=node.admin_up or not node.link_present,
)
# sparkrig owns the fabric subnet on the NIC: an address of it the plan does not give goes
strays = fabric_addresses_owned(
    name="Remove fabric addresses the plan does not give",
    interface=iface,
    held=list(node.ipv4),
    planned=address,
    subnets=[str(settings.fabric_network)],
)
link_drift = node.mtu != knobs.fabric_mtu or address not in node.ipv4
# Not `netplan apply`: with the NetworkManager renderer it disconnects every netplan-rendered
# device, flushes their addresses and restarts NetworkManager (docs/fabric.md). Render the
# profiles, let NM re-read them (active connections are left as they are), and (re)activate the
# fabric's profile alone.
applied = server.shell(
    name="Apply the fabric netplan to the fabric connection only",
    commands=[
        "netplan generate",
        "nmcli connection reload",
        f"nmcli --wait 90 connection up netplan-{iface}",
    ],
    _if=lambda: (
        takeover.did_change()
        or netplan.did_change()
        or link_up.did_change()
        or strays.did_change()
        or link_drift
    ),
)
pair_restart().trigger("fabric", applied)  # a re-applied fabric breaks NCCL's links
roce = roce_device_present(
    name="Bring the RoCE device back on the fabric NIC",
    interface=iface,
    commands=knobs.roce_device_restore,
    roce_device=settings.me.roce_device,
)
pair_restart().trigger("roce_device", roce)  # a new device: every queue pair of the old is gone
fabric_path_proven(
    name="Prove the fabric MTU end to end with do-not-fragment pings",
    interface=iface,
    peers=[r.ip for r in settings.others],
    mtu=knobs.fabric_mtu,
)
rank_env = dict(
    dest=paths(settings)["env_file"],
    template="rank.env.j2",
    context=env_context(settings),
    fabric_ip=settings.me.ip,
    fabric_interface=iface,
    roce_device=settings.me.roce_device,
    roce_port=knobs.roce_port,
)
env = rank_env_written(
    name="Write the rank environment with the detected RoCE GID index", **rank_env
)
pair_restart().trigger("env", env)
# Not a trigger: a rank resolves its GID index at every start, so the running pair already has it.
rank_env_written(
    name="Record a RoCE GID index that moved alone (no restart)", moved_gid_only=True, **rank_env
)
