"""Phase 6, service: the rank's units, then an ordered start: worker(s) first, the head once every
worker's container runs (its beacon answers over the fabric), never a fixed sleep. A change to any
rank's unit, env file, image or weights restarts the whole pair in that order; nothing else does.
A run without the head (`--limit worker`) never stops a worker's rank itself: the worker asks the
head's supervisor for the ordered restart, so the pair serves again at the end of the run."""

import shlex
from typing import Any

from pyinfra import host, inventory, logger
from pyinfra.operations import python, server, systemd

from sparkrig import hostpkg, hoststate
from sparkrig.busbw import smoke_figures
from sparkrig.config.inventory import current, for_inventory
from sparkrig.helperunits import (
    agent_unit_context,
    keep_helper_running,
    pair_unit_context,
    restart_args,
    role_template,
    supervisor_unit_context,
    watchdog_unit_context,
)
from sparkrig.image import serving_image
from sparkrig.ordering import on_head, on_workers
from sparkrig.owned import file_absent, file_present, secret_installed, unit_state_set
from sparkrig.pairrestart import pair_restart
from sparkrig.pairsecret import api_key, control_token, pair_secret, write_control_copy_later
from sparkrig.paths import paths
from sparkrig.release import change
from sparkrig.render import base_context, render
from sparkrig.rollback import rollback
from sparkrig.runningrank import peer_down_marked, rank_thawed, stale_gid_dropped
from sparkrig.secretio import secret_relayed
from sparkrig.serving import (
    SMOKE_CONTAINER,
    api_key_env,
    function_smoke_run_args,
    link_smoke_run_args,
    rank_unit_context,
    smoke_run_args,
    weights_id,
)
from tasks.pair_start import pair_started_in_order
from tasks.pair_stop import pair_stopped_in_order

settings = current()
knobs = settings.knobs
host_paths = paths(settings)
weights = weights_id(settings)

# The stop-together watch and the helpers run the host package's pair job (shipped by the host
# phase): a change to any module that job loads restarts them, a change elsewhere does not.
pair_program = hostpkg.changed("pair")
image = serving_image(settings)  # the patched image every rank runs (tasks/image.py builds it)
# The API key (knob api_auth) lives with the head, like the agents' secret (sparkrig/pairsecret.py):
# the head's installed key wins, the control side's copy (api_key_file) is used only when the head
# has none, a new one is made only when neither has one or on request (api_key_rotate). On the head
# 0600 root twice: the key alone for the gates and the watchdog's probe, and the docker env file
# that gives it to vLLM as VLLM_API_KEY (in no unit file, no argv, no `ps`). A new key restarts the
# pair (vLLM reads it at start). The control side gets a copy of the head's key when it lacks it,
# for the clients. Without the head in the run (--limit worker) nothing about the key is decided.
# Off: both files go and the rank unit loses its --env-file.
is_head = settings.me.is_head
everyone = for_inventory(inventory)
head_knobs = everyone[settings.head.name].knobs  # head-only knobs, the same everywhere
api = api_key(settings, hoststate.values)
if head_knobs.api_auth and api is not None and api.sha256:
    # A key the control side lacks is the head's own, judged by digest (its files stay as they
    # are; a lost env file was refused at preflight): never read back, except once at apply
    # time for the clients' copy below (sparkrig/secretio.py).
    if api.known:
        on_head(
            is_head,
            secret_installed,
            name="Install the API key",
            text=api.token + "\n",
            dest=host_paths.api_key,
        )
        key_env = on_head(
            is_head,
            secret_installed,
            name="Install the API key env file for vLLM",
            text=api_key_env(api.token),
            dest=host_paths.api_key_env,
        )
        pair_restart().trigger("api_key", key_env)
    if not api.known or control_token(head_knobs.api_key_file) != api.token:
        on_head(
            is_head,
            python.call,
            name="Keep a copy of the head's API key on the control machine",
            function=write_control_copy_later(
                head_knobs.api_key_file, api.token, api.holder, host_paths.api_key, api.sha256
            ),
        )
elif not head_knobs.api_auth:
    for path in host.loop([host_paths.api_key, host_paths.api_key_env]):
        on_head(
            is_head,
            file_absent,
            name="Remove the API key while api_auth is off",
            path=path,
        )
rank_unit = file_present(
    name="Install the rank unit",
    text=render("sparkrig-rank.service.j2", **rank_unit_context(settings, image, weights)),
    dest=host_paths.rank_unit,
)
pair_unit = file_present(
    name="Install the stop-together unit",
    text=render("sparkrig-pair.service.j2", **pair_unit_context(settings)),
    dest=host_paths.pair_unit,
)
restart = pair_restart()
restart.trigger("rank_unit", rank_unit)
restart.trigger("pair_unit", pair_unit)

systemd.daemon_reload(
    name="Reload systemd after a unit changed",
    _if=lambda: rank_unit.did_change() or pair_unit.did_change(),
)

# Ordered restarts without the control machine: each worker runs an agent that starts its rank when
# the head asks (a shared secret that lives with the pair: sparkrig/pairsecret.py; preflight refused
# ranks holding different ones); the head gets `sparkrig-restart-pair` and, when the watchdog knob
# is on, the watchdog that uses it. The helpers read the secret once at start: a changed secret
# restarts them.
agents_secret = pair_secret(settings, hoststate.values)
if agents_secret.known:
    secret = secret_installed(
        name="Install the agents' shared secret",
        text=agents_secret.token + "\n",
        dest=host_paths.pair_token,
    )
else:  # the pair's, known by digest only: a rank lacking it gets a holder's copy at apply time
    lacks = hoststate.read(settings).pair_secret.sha256 != agents_secret.sha256
    secret = secret_relayed(
        name="Install the agents' shared secret",
        source=agents_secret.holder,
        source_path=host_paths.pair_token,
        dest=host_paths.pair_token,
        sha256=agents_secret.sha256,
        _if=lambda: lacks,
    )
agent_unit = role_template(
    on_workers,
    is_head,
    name="Install the worker agent unit",
    template="sparkrig-agent.service.j2",
    context=agent_unit_context(settings),
    dest=host_paths.agent_unit,
)
keep_helper_running(
    on_workers,
    is_head,
    "sparkrig-agent",
    lambda: agent_unit.did_change() or pair_program() or secret.did_change(),
)
role_template(
    on_head,
    is_head,
    name="Install the ordered pair restart command",
    template="sparkrig-restart-pair.j2",
    context={**base_context(settings), "restart_args": restart_args(settings)},
    dest=host_paths.restart_script,
    mode="755",
)
supervisor_unit = role_template(
    on_head,
    is_head,
    name="Install the pair supervisor unit",
    template="sparkrig-supervisor.service.j2",
    context=supervisor_unit_context(settings),
    dest=host_paths.supervisor_unit,
)
watchdog_on = head_knobs.watchdog
if watchdog_on:
    watchdog_unit = role_template(
        on_head,
        is_head,
        name="Install the watchdog unit",
        template="sparkrig-watchdog.service.j2",
        context=watchdog_unit_context(settings),
        dest=host_paths.watchdog_unit,
    )
else:
    on_head(
        is_head,
        unit_state_set,
        name="Stop the watchdog while it is switched off",
        service="sparkrig-watchdog",
        running=False,
        enabled=False,
    )
    on_head(
        is_head,
        file_absent,
        name="Remove the watchdog unit while it is switched off",
        path=host_paths.watchdog_unit,
    )

# The stop-together watch runs beside a live rank: a new program reloads the watch (it execs the
# new program keeping its beacon's socket open, so no peer reads it as gone), not the rank.
unit_state_set(
    name="Reload the stop-together watch after its program changed",
    service="sparkrig-pair",
    reloaded=True,
    _if=lambda: pair_program() and not restart(),
)

# Ordered pair restart and start. Every operation below exists on every host (acting only where
# its condition holds), so all hosts share one sequence and pyinfra's per-operation barrier orders
# them: stop every rank together, start the workers, wait for their containers, start the head.
rank_active, _ = hoststate.read(settings).unit(settings.unit_name)
# A rank serving beside a peer whose rank is down (a worker stopped while the head ran) is never
# joined by that peer alone: the pair restarts in order. Only the ranks of this run are read.
down_peers = [
    r.name
    for r in settings.others
    if host.state.is_host_in_limit(inventory.get_host(r.name))
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
# During an upgrade a failed smoke test or start does not stop the run: it decides the rollback
# (sparkrig/release.py, tasks/verify.py), and what would start the new release is skipped.
upgrading = bool(change(settings, hoststate.read(settings).release))
rolls_back = rollback()
# --limit worker: the head is not in this run. The worker then leaves its rank to the head's
# supervisor (an authenticated request below); anything needing the head is skipped, and said so.
head_in_run = host.state.is_host_in_limit(inventory.get_host(settings.head.name))
if not head_in_run:
    logger.info(
        f"{host.print_prefix}the head ({settings.head.name}) is not in this run: a pair restart "
        "is asked of its supervisor; the NCCL smoke test and the serving gates are skipped, and so "
        "is the image prune: run `pyinfra inventory.py deploy.py` with the head (no --limit) "
        "for them"
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
# NCCL smoke test before a pair (re)start: one all-reduce in the serving image on every rank, the
# workers launched first (they wait in the rendezvous), the head in the foreground, then the
# workers' verdicts. It fails the deploy, naming the transport, when NCCL did not use IB/RoCE.
# Without the head in the run there is no one to all-reduce with: skipped (logged above).
smoke = knobs.nccl_smoke and head_in_run


def smoke_due() -> bool:
    """The smoke test runs before a pair (re)start: this run restarts it or the rank is down."""
    return smoke and (restart() or not rank_active)


SMOKE_CLEAN = f"docker rm --force {SMOKE_CONTAINER} >/dev/null 2>&1 || true"
SMOKE_VERDICT = (  # a detached smoke test's exit code and last line (its JSON)
    f"rc=$(docker wait {SMOKE_CONTAINER}); docker logs --tail 1 {SMOKE_CONTAINER}; "
    f"docker rm {SMOKE_CONTAINER} >/dev/null; exit $rc"
)


def pair_smoke(names: tuple[str, str, str], workers_run: str, head_run: str, what: str) -> Any:
    """One NCCL smoke test of the pair: the workers launched (they wait in the rendezvous), the
    head in the foreground, then the workers' verdicts, each deciding a rollback during an
    upgrade (``what`` names it). This host's operation whose output holds its figure."""
    on_workers(is_head, server.shell, name=names[0], commands=[SMOKE_CLEAN, workers_run],
               _if=smoke_due)  # fmt: skip
    head_op = on_head(is_head, server.shell, name=names[1], commands=[head_run], _if=smoke_due,
                      _ignore_errors=upgrading)  # fmt: skip
    workers_op = on_workers(is_head, server.shell, name=names[2], commands=[SMOKE_VERDICT],
                            _if=smoke_due, _ignore_errors=upgrading)  # fmt: skip
    rolls_back.watch(what, head_op)
    rolls_back.watch(what, workers_op)
    return head_op if settings.me.is_head else workers_op


smoke_figures().watch(
    host.name,
    pair_smoke(
        (
            "Launch the NCCL smoke test on the workers",
            "Run the NCCL smoke test on the head",
            "Check the NCCL smoke test on the workers",
        ),
        shlex.join(smoke_run_args(settings, image, detach=True)),
        shlex.join(smoke_run_args(settings, image)),
        "NCCL smoke test",
    ),
)
# A pair on both functions: then each function alone (NCCL_IB_HCA one device), so the release
# keeps each one's figure and a slow function is named, held to one function's floor.
pair = settings.fabric_plan if settings.nnodes == 2 else None
for iface in host.loop(pair.ranks[settings.me.rank].ifaces if pair is not None else ()):
    alone = shlex.join(function_smoke_run_args(settings, image, iface.function))
    names = (
        "Launch the NCCL smoke test over one function on the workers",
        "Run the NCCL smoke test over one function on the head",
        "Check the NCCL smoke test over one function on the workers",
    )
    measured = pair_smoke(names, alone, alone, "NCCL smoke test over one function")
    smoke_figures().watch_function(host.name, iface.rdma, measured)
# A triangle or a ring: then the same test over each cable alone, between its two ends (the busbw
# of every link, issue 36), one cable after the other: the port-1 end launched, the port-0 end in
# the foreground (the rendezvous on its primary address there), then the port-1 end's verdict.
ring = settings.fabric_plan if settings.relayed else None
for cable in host.loop(ring.cables if ring is not None else ()):
    port0, port1 = cable.a.rank == settings.me.rank, cable.b.rank == settings.me.rank
    server.shell(
        name="Launch the NCCL smoke test over one cable at its port-1 end",
        commands=[SMOKE_CLEAN, shlex.join(link_smoke_run_args(settings, image, cable))]
        if port1
        else [],
        _if=lambda port1=port1: port1 and smoke_due(),
    )
    rolls_back.watch(
        "NCCL smoke test over a cable",
        server.shell(
            name="Run the NCCL smoke test over one cable at its port-0 end",
            commands=[shlex.join(link_smoke_run_args(settings, image, cable))] if port0 else [],
            _if=lambda port0=port0: port0 and smoke_due(),
            _ignore_errors=upgrading,
        ),
    )
    rolls_back.watch(
        "NCCL smoke test over a cable",
        server.shell(
            name="Check the NCCL smoke test over one cable at its port-1 end",
            commands=[SMOKE_VERDICT],
            _if=lambda port1=port1: port1 and smoke_due(),
            _ignore_errors=upgrading,
        ),
    )
pair_started_in_order(
    settings,
    names=(
        "Start the worker rank", "Wait until every worker's container runs", "Start the head rank"
    ),
    when=(
        lambda: (head_in_run or not (restart() or not rank_active)) and not rolls_back(),
        lambda: (restart() or not rank_active) and not rolls_back(),
        lambda: not rolls_back(),
    ),
    enabled=True,
    ignore_errors=upgrading,
    watch=rolls_back,
    after_workers=lambda: on_workers(
        is_head,
        server.shell,
        name="Ask the head's supervisor to restart the pair in order",
        commands=[
            shlex.join(
                [
                    *hostpkg.command(knobs.install_dir, "pair"), "request",
                    "--head", settings.dial(settings.head),
                    "--port", str(knobs.pair_port), "--agent-port", str(knobs.agent_port),
                    "--token-file", host_paths.pair_token, "--timeout", "900",
                ]
            )
        ],
        _if=lambda: not head_in_run and (restart() or not rank_active),
    ),
)  # fmt: skip

keep_helper_running(
    on_head,
    is_head,
    "sparkrig-supervisor",
    lambda: supervisor_unit.did_change() or pair_program() or secret.did_change(),
)
if watchdog_on:
    keep_helper_running(
        on_head,
        is_head,
        "sparkrig-watchdog",
        lambda: watchdog_unit.did_change() or pair_program() or secret.did_change(),
    )

# The programs of an earlier sparkrig, before the host package: every unit above now runs the
# package, so nothing starts them any more. Kept while the release changes: a rollback puts the
# previous release's rank unit back (sparkrig/release.py), and one from before the package runs
# them; the first run without a release change removes them.
for legacy in host.loop(hostpkg.legacy_files(knobs.install_dir)):
    file_absent(
        name="Remove the programs the host package replaced",
        path=legacy,
        _if=lambda: not upgrading,
    )
