"""Phase 6, service, 4 of 7: the ordered pair restart's stop. Every operation from here to the end
of the ordered start (tasks/smoke.py, tasks/start.py) exists on every host (acting only where its
condition holds), so all hosts share one sequence and pyinfra's per-operation barrier orders them:
stop every rank together, start the workers, wait for their containers, start the head. A change to
any rank's unit, env file, image or weights restarts the whole pair in that order; so does a
running rank that cannot serve as it is (sparkrig/runningrank.py, triggered here); nothing else
does."""

from pyinfra import host, inventory, logger
from pyinfra.operations import server

from sparkrig import hoststate
from sparkrig.config.inventory import current, for_inventory
from sparkrig.drain import drain_command, drains
from sparkrig.endpoint import balanced
from sparkrig.front import SITE
from sparkrig.ordering import in_this_run, on_head
from sparkrig.pairrestart import pair_restart
from sparkrig.paths import paths
from sparkrig.runningrank import peer_down_marked, rank_thawed, stale_gid_dropped
from tasks.pair_stop import pair_stopped_in_order

settings = current()
knobs = settings.knobs
host_paths = paths(settings)
everyone = for_inventory(inventory)
watchdog_on = everyone[settings.head.name].knobs.watchdog  # a head-only knob: the same everywhere
restart = pair_restart()
rank_active, _ = hoststate.read(settings).unit(settings.unit_name)
# A rank serving beside a peer whose rank is down (a worker stopped while the head ran) is never
# joined by that peer alone: the pair restarts in order. Only the ranks of this run are read.
down_peers = [
    r.name
    for r in settings.others
    if in_this_run(r.name)
    and hoststate.read(everyone[r.name]).owned.is_down(everyone[r.name].unit_name)
]
restart.trigger(
    "peer_down",
    peer_down_marked(
        name="Mark a rank serving beside a rank that is down for an ordered restart",
        unit=settings.unit_name,
        running=rank_active,
        down_peers=down_peers,
        run_dir=host_paths.run_dir,
    ),
)
# A running rank that cannot serve as it is restarts the pair: its container frozen by `docker
# pause`, or its RoCE GID index moved under it (the container keeps the index it started with).
restart.trigger(
    "frozen",
    rank_thawed(
        name="Thaw a rank container frozen by docker pause",
        container=settings.container_name,
        running=rank_active,
    ),
)
restart.trigger(
    "gid_moved",
    stale_gid_dropped(
        name="Drop a GID hand-over that the live RoCE device no longer matches",
        fabric_ip=settings.me.ip,
        fabric_interface=settings.me.fabric_interface,
        running=rank_active,
        roce_device=settings.me.roce_device,
        roce_port=knobs.roce_port,
        functions=[
            (i.netdev, i.rdma, str(i.address.ip))
            for i in (settings.fabric_rank.ifaces if settings.fabric_rank else ())
        ],
    ),
)
# --limit worker: the head is not in this run. The worker then leaves its rank to the head's
# supervisor (an authenticated request, tasks/start.py); anything needing the head is skipped, and
# said so.
head_in_run = in_this_run(settings.head.name)
if not head_in_run:
    logger.info(
        f"{host.print_prefix}the head ({settings.head.name}) is not in this run: a pair restart "
        "is asked of its supervisor; the NCCL smoke test and the serving gates are skipped, and so "
        "is the image prune: run `pyinfra inventory.py deploy.py` with the head (no --limit) "
        "for them"
    )
# Behind one endpoint, a pair leaves the balance before it stops: new requests go to the other
# pairs, and those in flight finish (up to drain_timeout_s). Where no front serves yet, nothing
# has to leave (tasks/verify.py puts the pair back once it passed its gates).
front_serves = balanced(settings) and hoststate.read(settings).owned.file(SITE) is not None
drains().add(
    host.name,
    on_head(
        front_serves,
        server.shell,
        name="Drain the pair out of the endpoint's balance before it restarts",
        commands=[drain_command(settings)],
        _if=lambda: head_in_run and restart(),
    ),
)
pair_stopped_in_order(
    settings,
    helpers=[
        (
            "Pause the watchdog during an ordered pair restart",
            "sparkrig-watchdog",
            lambda: watchdog_on and restart(),
        ),
        (
            "Pause the supervisor during the deploy's pair start",
            "sparkrig-supervisor",
            lambda: restart() or not rank_active,
        ),
    ],
    ranks=("Stop every rank for an ordered pair restart", lambda: head_in_run and restart()),
)
