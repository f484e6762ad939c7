"""Phase 3, fabric: the QSFP NIC's netplan file (static address, MTU 9000, no IPv6 so GID indices
stay put), applied only when it or the live link drifted, proved with do-not-fragment pings;
then the rank's env file with the RoCE v2 GID index read from sysfs."""

from pyinfra import host
from pyinfra.operations import server

from sparkrig.facts import Node
from sparkrig.operations import fabric_path, note_restart_trigger, put_text, rank_env_file
from sparkrig.render import render
from sparkrig.settings import current
from sparkrig.units import base_context, env_context, paths

s = current()
k = s.knobs
iface, address = s.me.fabric_interface, s.me.fabric_address.with_prefixlen
node = host.get_fact(Node, weights_dir=k.weights_dir, fabric_interface=iface)

netplan = put_text(
    name="Persist the fabric address and MTU with netplan",
    text=render("netplan-fabric.yaml.j2", **base_context(s), address=address, mtu=k.fabric_mtu),
    dest=k.fabric_netplan_file,
    mode="600",
)
link_drift = node.mtu != k.fabric_mtu or address not in node.ipv4
applied = server.shell(
    name="Apply the fabric netplan",
    commands=[
        "netplan apply",
        f"ip link set dev {iface} mtu {k.fabric_mtu} up",
        f"ip addr replace {address} dev {iface}",
    ],
    _if=lambda: netplan.did_change() or link_drift,
)
note_restart_trigger(applied)  # a re-applied fabric (MTU reset, address lost) breaks NCCL's links
fabric_path(
    name="Prove the fabric MTU end to end with do-not-fragment pings",
    interface=iface,
    peers=[r.ip for r in s.peers],
    mtu=k.fabric_mtu,
)
env = rank_env_file(
    name="Write the rank environment with the detected RoCE GID index",
    dest=paths(s)["env_file"],
    template="rank.env.j2",
    context=env_context(s),
    fabric_ip=s.me.ip,
    fabric_interface=iface,
    roce_device=s.me.roce_device,
    roce_port=k.roce_port,
)
note_restart_trigger(env)
