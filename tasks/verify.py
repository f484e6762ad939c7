"""Phase 7, verify: the deploy ends by checking itself. After a (re)start the head's boot is
followed stage by stage; then four gates must pass: /health, /v1/models lists the served name,
"17*23" answers 391, and a forced tool call parses. /health alone lies when a worker is dead, so
the stop-together beacons (service phase) keep both ranks' liveness tied together. Old images are
pruned only after the gates passed.

Every operation exists on every host (acting only where its condition holds), so all hosts share
one sequence and the per-operation barrier keeps the prune behind the gates."""

from dataclasses import replace

from pyinfra import inventory, state

from sparkrig import hoststate
from sparkrig.baseline import report_of as baseline_of
from sparkrig.gates import gate_command, wait_command
from sparkrig.image import images_to_keep, prune_old_images
from sparkrig.ordering import on_head
from sparkrig.pairrestart import pair_restart
from sparkrig.release import (
    change,
    history,
    images_kept,
    old_weights_pruned,
    record_path,
    record_stamped,
    release_files,
    report_of,
    rollback,
    rollback_operations,
    wanted,
    weights_kept,
)
from sparkrig.serving import api_key_file, serving_gates, wait_until_serving
from sparkrig.settings import current

s = current()
k = s.knobs
is_head = s.me.is_head

was_running, _ = hoststate.read(s).unit(s.unit_name)
restart = pair_restart()
# During an upgrade (sparkrig/release.py) a failed boot or gate does not stop the run: it decides
# the rollback below, which puts the previous release back and fails the run naming both.
record = report_of(hoststate.read(s))
moving = change(s, record)
back = rollback()
boot = wait_command(
    k.install_dir, k.api_port, s.container_name, timeout=k.ready_timeout_s, interval=5
)
gates = gate_command(k.install_dir, k.api_port, k.served_model_name, key_file=api_key_file(s))
back.watch(
    "boot",
    on_head(
        is_head,
        wait_until_serving,
        name="Wait for the head's API to finish booting",
        command=boot,
        _if=lambda: (restart() or not was_running) and not back(),
        _ignore_errors=bool(moving),
    ),
)
back.watch(
    "gates",
    on_head(
        is_head,
        serving_gates,
        name="Pass the four serving gates",
        command=gates,
        _if=lambda: not back(),
        _ignore_errors=bool(moving),
    ),
)
rollback_operations(s, moving, record, boot, gates)

# Under --limit worker nothing proves the pair healthy, so nothing is recorded or pruned.
head_in_run = inventory.get_host(s.head.name) in state.activated_hosts
kept = history(wanted(s), record.releases, k.keep_releases)
baseline_now = baseline_of(hoststate.read(s))  # recorded with the release: the gates passed on it
record_stamped(
    name="Record the release that passed the gates",
    path=record_path(k.config_dir),
    release=replace(wanted(s), baseline=tuple(sorted(baseline_now.fields().items()))),
    files=release_files(s),
    keep=k.keep_releases,
    _if=lambda: head_in_run,
)
prune_old_images(
    name="Prune old sparkrig images once the pair is healthy",
    image_repo=k.image_repo,
    keep=sorted({*images_to_keep(s), *images_kept(kept)}),
    _if=lambda: head_in_run,
)
old_weights_pruned(
    name="Prune weights revisions no kept release uses",
    weights_dir=k.weights_dir,
    keep=weights_kept(kept),
    _if=lambda: head_in_run,
)
