"""Phase 6, service, 5 of 7: the NCCL smoke test before a pair (re)start: one all-reduce in the
serving image on every rank, the workers launched first (they wait in the rendezvous), the head in
the foreground, then the workers' verdicts. It fails the deploy, naming the transport, when NCCL
did not use IB/RoCE. A pair on both functions is then tested over each function alone, a triangle
or a ring over each cable alone. Without the head in the run there is no one to all-reduce with:
skipped (tasks/stop.py says so)."""

import shlex
from typing import Any

from pyinfra import host
from pyinfra.operations import server

from sparkrig import hoststate
from sparkrig.busbw import smoke_figures
from sparkrig.config.inventory import current
from sparkrig.image import serving_image
from sparkrig.ordering import in_this_run, on_head, on_workers
from sparkrig.pairrestart import pair_restart
from sparkrig.release import change
from sparkrig.rollback import rollback
from sparkrig.serving import (
    SMOKE_CONTAINER,
    function_smoke_run_args,
    link_smoke_run_args,
    smoke_run_args,
)

settings = current()
knobs = settings.knobs
is_head = settings.me.is_head
image = serving_image(settings)  # the patched image every rank runs (tasks/image.py builds it)
restart = pair_restart()
rank_active, _ = hoststate.read(settings).unit(settings.unit_name)
# During an upgrade a failed smoke test does not stop the run: it decides the rollback
# (sparkrig/rollback.py, tasks/verify.py), and what would start the new release is skipped.
upgrading = bool(change(settings, hoststate.read(settings).release))
rolls_back = rollback()
smoke = knobs.nccl_smoke and in_this_run(settings.head.name)


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
