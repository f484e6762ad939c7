"""Phase 7, verify: the deploy ends by checking itself. After a (re)start the head's boot is
followed stage by stage; then four gates must pass: /health, /v1/models lists the served name,
"17*23" answers 391, and a forced tool call parses. /health alone lies when a worker is dead, so
the stop-together beacons (service phase) keep both ranks' liveness tied together. Old images are
pruned only after the gates passed.

Every operation exists on every host (acting only where its condition holds), so all hosts share
one sequence and the per-operation barrier keeps the prune behind the gates."""

from pyinfra import inventory, state

from sparkrig import hoststate
from sparkrig.gates import gate_command, wait_command
from sparkrig.image import images_to_keep, prune_old_images
from sparkrig.pairrestart import pair_restart
from sparkrig.serving import api_key_file, serving_gates, wait_until_serving
from sparkrig.settings import current

s = current()
k = s.knobs
is_head = s.me.is_head

was_running, _ = hoststate.read(s).unit(s.unit_name)
restart = pair_restart()
wait_until_serving(
    name="Wait for the head's API to finish booting",
    command=wait_command(
        k.install_dir, k.api_port, s.container_name, timeout=k.ready_timeout_s, interval=5
    ),
    _if=lambda: is_head and (restart() or not was_running),
)
serving_gates(
    name="Pass the four serving gates",
    command=gate_command(k.install_dir, k.api_port, k.served_model_name, key_file=api_key_file(s)),
    acting=is_head,
)

# Under --limit worker nothing proves the pair healthy, so nothing is pruned.
head_in_run = inventory.get_host(s.head.name) in state.activated_hosts
prune_old_images(
    name="Prune old sparkrig images once the pair is healthy",
    image_repo=k.image_repo,
    keep=images_to_keep(s),
    _if=lambda: head_in_run,
)
