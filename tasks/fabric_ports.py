"""Phase 3, fabric, in fabric_layout "ports" (docs/rings.md): both PCIe functions of the pair's
cable. The cables checked against the plan before any address is set (who answers on each port,
every rank's probe); every fabric netdev's address and MTU in one netplan file, each netdev's
profile (re)activated alone when the file or the live link drifted; forwarding persisted where
the plan relays; each function proven with full-MTU don't-fragment pings both ways (a silent one
named, then refused or left out: fabric_link_silent); then the rank's env file naming every RDMA
device facing a peer (the GID by value per device: NCCL picks it, the start gate checks it)."""

from pyinfra import host, inventory, logger
from pyinfra.operations import server

from sparkrig import hoststate
from sparkrig.fabric import (
    FORWARDING_FILE,
    RELAY_UNIT,
    RELAY_UNIT_FILE,
    cabling_verdict,
    claims_displaced_args,
    env_context,
    env_template,
    fabric_addresses_owned,
    fabric_claims_displaced,
    fabric_functions_proven,
    fabric_link_raised,
    forwarding_text,
    graph_paths,
    graph_texts,
    judged_plan,
    netplan_text,
    ports_verdict,
    rank_env_written,
    relay_unit_text,
    roce_device_present,
)
from sparkrig.failing import problems_absent
from sparkrig.owned import file_absent, file_present, unit_state_set
from sparkrig.pairrestart import pair_restart
from sparkrig.paths import paths
from sparkrig.settings import current, for_inventory
from sparkrig.topology import PlanError, link_name

settings = current()
knobs = settings.knobs
plan, part = settings.fabric_plan, settings.fabric_rank
assert plan is not None and part is not None
everyone = for_inventory(inventory)
# the ranks of this run only: a rank left out by --limit is never reached (its cable is proven
# by this rank's pings instead)
reads = [
    hoststate.read(everyone[r.name])
    if host.state.is_host_in_limit(inventory.get_host(r.name))
    else None
    for r in settings.ranks
]
mine = reads[settings.me.rank]
assert mine is not None
node = mine.node
names = [r.name for r in settings.ranks]

# This rank's ports as sysfs has them against the plan's names, then the cables against the
# plan, from every rank's probe, before any address is set.
named, undiscovered = ports_verdict(settings, mine.fabric_ports)
for note in undiscovered:
    logger.warning(f"{host.print_prefix}{note}")
cabling, unchecked = cabling_verdict(settings, [r.fabric_probe if r else None for r in reads])
for note in unchecked:
    logger.warning(f"{host.print_prefix}{note}")
# The links both of whose ends hold their address: judged by knob fabric_link_silent now.
try:
    kept, silent, judged = judged_plan(settings, [r.fabric_links if r else {} for r in reads])
    refused = silent if knobs.fabric_link_silent == "refuse" else []
except PlanError as err:  # a cable with neither function answering: refused either way
    kept, silent, judged, refused = plan, [], set(), list(err.problems)
for note in silent if not refused else []:
    logger.warning(f"{host.print_prefix}{note}")
problems_absent(
    name="Check the fabric's cables and links against the plan before any address is set",
    problems=named + cabling + refused,
    heading="the fabric differs from the plan (docs/rings.md)",
    passed="every cable answers where the plan has it",
)

# preflight refused these unless fabric_takeover is set (the claims on the rank's first netdev)
takeover = fabric_claims_displaced(
    name="Move other configurations of the fabric NIC aside (fabric_takeover)",
    **claims_displaced_args(settings, node),
)
# every function of the plan keeps its address, even one left out (it is proven again each run)
netplan = file_present(
    name="Persist every fabric netdev's address and MTU with netplan",
    text=netplan_text(settings),
    dest=knobs.fabric_netplan_file,
    mode="600",
)
links = mine.fabric_links
raised = []
for iface in host.loop(part.ifaces):
    have = links.get(iface.netdev)
    raised.append(
        fabric_link_raised(
            name="Bring each fabric netdev up when it is administratively down",
            interface=iface.netdev,
            admin_up=have is None or not have.present or have.admin_up,
        )
    )
# sparkrig owns the fabric's range on every fabric netdev: an address of it the plan does not
# give that netdev goes (its traffic would leave from it, and the peer's firewall drops it)
strays = [
    fabric_addresses_owned(
        name="Remove fabric addresses the plan does not give",
        interface=iface.netdev,
        held=list(have.ipv4) if (have := links.get(iface.netdev)) is not None else [],
        planned=str(iface.address),
        subnets=[str(plan.cidr)],
    )
    for iface in host.loop(part.ifaces)
]
drift = [
    i.netdev
    for i in part.ifaces
    if (have := links.get(i.netdev)) is None
    or have.mtu != knobs.fabric_mtu
    or str(i.address) not in have.ipv4
]
# Not `netplan apply` (docs/fabric.md): render the profiles, let NM re-read them, and
# (re)activate each fabric netdev's profile alone.
applied = server.shell(
    name="Apply the fabric netplan to the fabric connections only",
    commands=[
        "netplan generate",
        "nmcli connection reload",
        *[f"nmcli --wait 90 connection up netplan-{dev}" for dev in part.netdevs],
    ],
    _if=lambda: (
        takeover.did_change()
        or netplan.did_change()
        or any(r.did_change() for r in raised)
        or any(r.did_change() for r in strays)
        or bool(drift)
    ),
)
pair_restart().trigger("fabric", applied)  # a re-applied fabric breaks NCCL's links
forwarding = forwarding_text(settings)
if forwarding is not None:  # a relaying ring (refused by settings until it is applied)
    sysctl = file_present(
        name="Persist forwarding and rp_filter on the relaying fabric netdevs",
        text=forwarding,
        dest=FORWARDING_FILE,
    )
    server.shell(
        name="Apply forwarding and rp_filter on the relaying fabric netdevs",
        commands=[f"sysctl -p {FORWARDING_FILE}"],
        _if=sysctl.did_change,
    )
else:
    file_absent(
        name="Remove the fabric forwarding settings while the plan relays nothing",
        path=FORWARDING_FILE,
    )
relay = relay_unit_text(settings)
if relay is not None:  # docker's FORWARD chain drops the relay unless DOCKER-USER accepts it
    relay_unit = file_present(
        name="Install the unit that lets docker's forward chain pass the fabric relay",
        text=relay,
        dest=RELAY_UNIT_FILE,
    )
    unit_state_set(
        name="Reload the fabric relay's DOCKER-USER rules after their unit changed",
        service=RELAY_UNIT,
        restarted=True,
        daemon_reload=True,
        _if=relay_unit.did_change,
    )
    unit_state_set(
        name="Keep the fabric relay's DOCKER-USER rules in place and enabled with docker",
        service=RELAY_UNIT,
        running=True,
        enabled=True,
    )
else:
    unit_state_set(
        name="Stop the fabric relay's DOCKER-USER rules while the plan relays nothing",
        service=RELAY_UNIT,
        running=False,
        enabled=False,
    )
    file_absent(
        name="Remove the fabric relay's unit while the plan relays nothing", path=RELAY_UNIT_FILE
    )
for iface in host.loop(part.ifaces):
    roce = roce_device_present(
        name="Bring each RoCE device back on its fabric netdev",
        interface=iface.netdev,
        commands=knobs.roce_device_restore,
        roce_device=iface.rdma,
    )
    pair_restart().trigger("roce_device", roce)  # a new device: its queue pairs are gone
mine = kept.ranks[settings.me.rank]
fabric_functions_proven(
    name="Prove each fabric function end to end with do-not-fragment pings",
    pings=[
        (i.netdev, str(i.peer_address), link_name(plan, plan.link(i.cable, i.function), names))
        for i in mine.ifaces
    ],
    mtu=knobs.fabric_mtu,
    proven=all(
        (i.cable, i.function) in judged and (have := links.get(i.netdev)) is not None and have.df_ok
        for i in mine.ifaces
    ),  # fmt: skip
    omit=knobs.fabric_link_silent == "omit",
)
rank_env = dict(
    dest=paths(settings)["env_file"],
    template=env_template(settings),
    context=env_context(settings, kept),
    fabric_ip=str(mine.ifaces[0].address.ip),
    fabric_interface=mine.ifaces[0].netdev,
    roce_device=mine.ifaces[0].rdma,
    roce_port=knobs.roce_port,
)
env = rank_env_written(
    name="Write the rank environment naming every RDMA device facing a peer", **rank_env
)
pair_restart().trigger("env", env)
# A ring's NCCL graph files (the env names them: NCCL_GRAPH_FILE, TF_NCCL_RING_GRAPHS), from the
# same judged plan as the env, whole files mounted read-only into the rank's container; the engine
# reads them at start, so a changed one restarts the pair. Removed where the plan has none.
graphs = graph_texts(settings, kept)
for graph in host.loop(graph_paths(settings).values()):
    if graph in graphs:
        written = file_present(
            name="Write the ring rank's NCCL graph files", text=graphs[graph], dest=graph
        )
    else:
        written = file_absent(
            name="Remove the ring's NCCL graph files while the plan has none", path=graph
        )
    pair_restart().trigger("graph_files", written)
