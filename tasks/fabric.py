"""Phase 3, fabric: one sequence for every layout (docs/fabric.md, docs/rings.md). A pair's or a
ring's cables checked against the plan before any address is set (who answers on each port,
every rank's probe of this run); every fabric netdev's address and MTU in one netplan file
(rendered by NetworkManager as on DGX OS), each netdev's profile (re)activated alone when the
file or the live link drifted; forwarding persisted where the plan relays; the RoCE devices; the
MTU proven end to end with don't-fragment pings; then the rank's env file naming the RoCE
devices (fabric_layout "single": the one netdev on a switch, its GID index read from sysfs and
pinned; "ports": every device facing a peer, the GID by value per device)."""

from pyinfra import host, inventory, logger
from pyinfra.operations import server

from sparkrig import hoststate
from sparkrig.config.inventory import current, for_inventory
from sparkrig.fabric import (
    FORWARDING_FILE,
    RELAY_UNIT,
    RELAY_UNIT_FILE,
    Netdev,
    cabling_verdict,
    claims_displaced_args,
    env_context,
    env_template,
    fabric_addresses_owned,
    fabric_claims_displaced,
    fabric_functions_proven,
    fabric_link_raised,
    fabric_path_proven,
    forwarding_text,
    graph_paths,
    graph_texts,
    judged_plan,
    netplan_text,
    owned_subnet,
    ports_verdict,
    rank_env_written,
    rank_netdevs,
    relay_unit_text,
    roce_device_present,
    single_link,
)
from sparkrig.failing import problems_absent
from sparkrig.ordering import in_this_run
from sparkrig.owned import UnitNames, file_absent, file_present, unit_owned
from sparkrig.pairrestart import pair_restart
from sparkrig.paths import paths
from sparkrig.topology import PlanError, link_name

settings = current()
knobs = settings.knobs
plan = settings.fabric_plan  # None: fabric_layout "single"
me = hoststate.read(settings)
node = me.node
netdevs = rank_netdevs(settings)
names = [r.name for r in settings.ranks]

kept, judged = plan, set[tuple[int, int]]()
if plan is not None:
    # the ranks of this run only: a rank left out by --limit is never reached (its cable is
    # proven by this rank's pings instead)
    everyone = for_inventory(inventory)
    reads = [
        hoststate.read(everyone[r.name]) if in_this_run(r.name) else None for r in settings.ranks
    ]
    # this rank's ports as sysfs has them against the plan's names, then the cables against the
    # plan, from every read rank's probe, before any address is set
    named, undiscovered = ports_verdict(settings, me.fabric_ports)
    for note in undiscovered:
        logger.warning(f"{host.print_prefix}{note}")
    cabling, unchecked = cabling_verdict(settings, [r.fabric_probe if r else None for r in reads])
    for note in unchecked:
        logger.warning(f"{host.print_prefix}{note}")
    # the links both of whose ends hold their address: judged by knob fabric_link_silent now
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
# each netdev as the host has it: the plan's FabricLinks, or the node report's one netdev
links = (
    me.fabric_links
    if plan is not None
    else {n.netdev: single_link(n.netdev, node) for n in netdevs}
)

# preflight refused these unless fabric_takeover is set (the claims on the rank's first netdev)
takeover = fabric_claims_displaced(
    name="Move other configurations of the fabric NIC aside (fabric_takeover)",
    **claims_displaced_args(settings, node),
)
# every netdev of the plan keeps its address, even one left out (it is proven again each run)
netplan = file_present(
    name="Persist the fabric address and MTU with netplan",
    text=netplan_text(settings),
    dest=knobs.fabric_netplan_file,
    mode="600",
)
# sparkrig owns the links: one that is administratively down is brought up (then re-applied)
raised = []
for n in host.loop(netdevs):
    have = links.get(n.netdev)
    raised.append(
        fabric_link_raised(
            name="Bring the fabric link up when it is administratively down",
            interface=n.netdev,
            admin_up=have is None or not have.present or have.admin_up,
        )
    )
# sparkrig owns the fabric's range on every fabric netdev: an address of it the plan does not
# give that netdev goes (its traffic would leave from it, and the peer's firewall drops it)
strays = [
    fabric_addresses_owned(
        name="Remove fabric addresses the plan does not give",
        interface=n.netdev,
        held=list(have.ipv4) if (have := links.get(n.netdev)) is not None else [],
        planned=n.address,
        subnets=[owned_subnet(settings)],
    )
    for n in host.loop(netdevs)
]
drift = [
    n.netdev
    for n in netdevs
    if (have := links.get(n.netdev)) is None
    or have.mtu != knobs.fabric_mtu
    or n.address not in have.ipv4
]
# Not `netplan apply`: with the NetworkManager renderer it disconnects every netplan-rendered
# device, flushes their addresses and restarts NetworkManager (docs/fabric.md). Render the
# profiles, let NM re-read them (active connections are left as they are), and (re)activate
# each fabric netdev's profile alone.
applied = server.shell(
    name="Apply the fabric netplan to the fabric connection only",
    commands=[
        "netplan generate",
        "nmcli connection reload",
        *[f"nmcli --wait 90 connection up netplan-{n.netdev}" for n in netdevs],
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
if plan is not None:  # a ring that relays persists forwarding; a pair or "single" has none
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
    # docker's FORWARD chain drops a ring's relay unless DOCKER-USER accepts it
    unit_owned(
        service=RELAY_UNIT,
        dest=RELAY_UNIT_FILE,
        text=relay_unit_text(settings),
        names=UnitNames(
            install="Install the unit that lets docker's forward chain pass the fabric relay",
            restart="Reload the fabric relay's DOCKER-USER rules after their unit changed",
            keep="Keep the fabric relay's DOCKER-USER rules in place and enabled with docker",
            stop="Stop the fabric relay's DOCKER-USER rules while the plan relays nothing",
            remove="Remove the fabric relay's unit while the plan relays nothing",
        ),
    )
for n in host.loop(netdevs):
    roce = roce_device_present(
        name="Bring the RoCE device back on the fabric NIC",
        interface=n.netdev,
        commands=knobs.roce_device_restore,
        roce_device=n.rdma,
    )
    pair_restart().trigger("roce_device", roce)  # a new device: every queue pair of the old is gone
if kept is None:  # one netdev on a switch: every other rank, pinged at each run
    fabric_path_proven(
        name="Prove the fabric MTU end to end with do-not-fragment pings",
        interface=netdevs[0].netdev,
        peers=[r.ip for r in settings.others],
        mtu=knobs.fabric_mtu,
    )
else:  # each function of the plan, to the peer function it faces
    fabric_functions_proven(
        name="Prove each fabric function end to end with do-not-fragment pings",
        pings=[
            (i.netdev, str(i.peer_address), link_name(kept, kept.link(i.cable, i.function), names))
            for i in kept.ranks[settings.me.rank].ifaces
        ],
        mtu=knobs.fabric_mtu,
        proven=all(
            (i.cable, i.function) in judged
            and (have := links.get(i.netdev)) is not None
            and have.df_ok
            for i in kept.ranks[settings.me.rank].ifaces
        ),
        omit=knobs.fabric_link_silent == "omit",
    )
# the env's first netdev: the single one, or the first function the judged plan kept
if kept is None:
    fabric_ip, first = settings.me.ip, netdevs[0]
else:
    kept_first = kept.ranks[settings.me.rank].ifaces[0]
    fabric_ip, first = str(kept_first.address.ip), Netdev(kept_first.netdev, kept_first.rdma, "")
rank_env = dict(
    dest=paths(settings).env_file,
    template=env_template(settings),
    context=env_context(settings, kept),
    fabric_ip=fabric_ip,
    fabric_interface=first.netdev,
    roce_device=first.rdma,
    roce_port=knobs.roce_port,
)
env = rank_env_written(name="Write the rank environment of the fabric's RoCE devices", **rank_env)
pair_restart().trigger("env", env)
if kept is None:
    # Not a trigger: a rank resolves its GID index at every start, so the running pair already
    # has it.
    rank_env_written(
        name="Record a RoCE GID index that moved alone (no restart)",
        moved_gid_only=True,
        **rank_env,
    )
# A ring's NCCL graph files (the env names them: NCCL_GRAPH_FILE, TF_NCCL_RING_GRAPHS), from the
# same judged plan as the env, whole files mounted read-only into the rank's container; the engine
# reads them at start, so a changed one restarts the pair. Removed where the plan has none (none
# listed for "single").
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
