"""Phase 7, verify: the deploy ends by checking itself. After a (re)start the head's boot is
followed stage by stage; then five gates must pass, through the API front: /health, /v1/models
lists the served name, "17*23" answers 391, a forced tool call parses, and /invocations and
/tokenize answer 401 without the key (locked: the front checks it, docs/front.md). /health alone
lies when a worker is dead, so the stop-together beacons (service phase) keep both ranks' liveness
tied together. Old images are pruned only after the gates passed.

Every operation exists on every host (acting only where its condition holds), so all hosts share
one sequence and the per-operation barrier keeps the prune behind the gates."""

from dataclasses import replace

from pyinfra import host, inventory, state
from pyinfra.operations import server

from sparkrig import hoststate
from sparkrig.benchgate import Target, bench_figures, release_bench_passed
from sparkrig.bringup import api_serving, logs_to_read, serving_gates_passed, why_command
from sparkrig.busbw import smoke_figures
from sparkrig.config.api import api_ca_file, api_url, drafter_lock
from sparkrig.config.inventory import current
from sparkrig.drain import drained, restore_command
from sparkrig.endpoint import balanced
from sparkrig.front import front_gate_command, loopback_tls
from sparkrig.gates import wait_command
from sparkrig.imagebuild import images_to_keep, old_images_pruned
from sparkrig.ordering import on_head
from sparkrig.pairrestart import pair_restart
from sparkrig.release import (
    bench_to_reach,
    change,
    history,
    images_kept,
    record_path,
    record_stamped,
    release_files,
    wanted,
)
from sparkrig.revisiondirs import old_weights_pruned, weights_kept
from sparkrig.rollback import rollback
from sparkrig.runtime import readings, runtime_agreed, runtime_command, runtime_recorded
from sparkrig.soakgate import release_soak_held, soak_command, soak_figures
from tasks.rollback import roll_back

settings = current()
knobs = settings.knobs
is_head = settings.me.is_head

was_running, _ = hoststate.read(settings).unit(settings.unit_name)
restart = pair_restart()
# During an upgrade (sparkrig/rollback.py) a failed boot or gate does not stop the run: it decides
# the rollback below, which puts the previous release back and fails the run naming both.
record = hoststate.read(settings).release
release_change = change(settings, record)
rolls_back = rollback()
boot = wait_command(
    knobs.install_dir,
    knobs.api_port,
    settings.container_name,
    timeout=knobs.ready_timeout_s,
    interval=5,
    tls=loopback_tls(settings),
)
gates = front_gate_command(settings)
rolls_back.watch(
    "boot",
    on_head(
        is_head,
        api_serving,
        name="Wait for the head's API to finish booting",
        command=boot,
        explain=why_command(settings),
        _if=lambda: (restart() or not was_running) and not rolls_back(),
        _ignore_errors=bool(release_change),
    ),
)
# What each rank's engine really loaded (the NCCL build, CUDA runtime, driver), read once the
# head serves; the head refuses ranks on different NCCL builds or on a build listed as known bad
# (sparkrig/runtime.py), before the gates, and an upgrade refused so rolls back.
runtime_recorded(
    name="Read the NCCL, CUDA runtime and driver the engine loaded",
    command=runtime_command(settings),
    _if=lambda: not rolls_back(),
)
in_run = [r.name for r in settings.ranks if inventory.get_host(r.name) in state.activated_hosts]
rolls_back.watch(
    "runtime",
    on_head(
        is_head,
        runtime_agreed,
        name="Refuse a release whose ranks loaded different or known-bad NCCL builds",
        ranks=in_run,
        known_bad_ok=knobs.nccl_known_bad_ok,
        _if=lambda: not rolls_back(),
        _ignore_errors=bool(release_change),
    ),
)
rolls_back.watch(
    "gates",
    on_head(
        is_head,
        serving_gates_passed,
        name="Pass the five serving gates",
        command=gates,
        logs=logs_to_read(settings),
        _if=lambda: not rolls_back(),
        _ignore_errors=bool(release_change),
    ),
)
# Under --limit worker nothing proves the pair healthy, so nothing is recorded or pruned.
head_in_run = inventory.get_host(settings.head.name) in state.activated_hosts
# A release that changes (or the first one) must reach 1 - bench_tolerance of the previous
# release's short-bench figures (sparkrig/benchgate.py); the first one's become the baseline.
# Each stack is held to its own: a stack switch to that stack's last kept figures, or none.
# The bench runs from the control machine; a shortfall decides the rollback like a failed gate.
serving = record.serving
gate_wanted = knobs.bench_gate and head_in_run and (bool(release_change) or serving is None)
benched = bench_figures()
rolls_back.watch(
    "bench",
    on_head(
        is_head,
        release_bench_passed,
        name="Hold a new release to the previous release's bench figures",
        target=Target(
            url=api_url(settings),
            model=knobs.served_model_name,
            key_file=knobs.api_key_file if knobs.api_auth else None,
            profile=knobs.profile,
            ca_file=api_ca_file(settings),
            drafter_lock=drafter_lock(settings),
            stack=knobs.stack,
            pair_only=balanced(settings),
        ),
        previous=bench_to_reach(wanted(settings), record),
        tolerance=knobs.bench_tolerance,
        timeout_s=knobs.bench_timeout_s,
        record=lambda figures: setattr(benched, "measured", figures),
        runs=knobs.bench_gate_runs,
        acceptance_min=knobs.bench_acceptance_min,
        fabric=smoke_figures().figure_of(host.name),
        _if=lambda: gate_wanted and not rolls_back(),
        _ignore_errors=bool(release_change),
    ),
)
# Then the soak: the same release held under soak_streams of load for soak_minutes on the head
# (sparkrig/soakgate.py), judged by the watchdog's rule; a wedge or a slow minute rolls back too.
soak_wanted = knobs.soak_minutes > 0 and head_in_run and (bool(release_change) or serving is None)
soaked = soak_figures()
rolls_back.watch(
    "soak",
    soaked.watch(
        host.name,
        on_head(
            is_head,
            release_soak_held,
            name="Hold the new release under load for soak_minutes",
            command=soak_command(settings),
            _if=lambda: soak_wanted and not rolls_back(),
            _ignore_errors=bool(release_change),
        ),
    ),
)
on_head(
    is_head,
    server.shell,
    name="Put the pair back into the endpoint's balance once it passed its gates",
    commands=[restore_command(settings)],
    _if=lambda: drained(host.name) and not rolls_back(),
)
roll_back(settings, release_change, record, boot, gates)

kept = history(wanted(settings), record.releases, knobs.keep_releases)
baseline_now = hoststate.read(settings).baseline  # recorded with the release: gates passed on it
record_stamped(
    name="Record the release that passed the gates",
    path=record_path(knobs.config_dir),
    release=replace(wanted(settings), baseline=tuple(sorted(baseline_now.fields().items()))),
    files=release_files(settings),
    keep=knobs.keep_releases,
    fabric=smoke_figures().figure_of(host.name),
    bench=benched.figure,
    runtime=readings().of(host.name),
    soak=soaked.figure_of(settings.head.name),
    _if=lambda: head_in_run,
)
old_images_pruned(
    name="Prune old sparkrig images once the pair is healthy",
    image_repo=knobs.image_repo,
    keep=sorted({*images_to_keep(settings), *images_kept(kept)}),
    _if=lambda: head_in_run,
)
old_weights_pruned(
    name="Prune weights revisions no kept release uses",
    weights_dir=knobs.weights_dir,
    keep=weights_kept(kept),
    _if=lambda: head_in_run,
)
