"""Phase 6, service, 2 of 7: the rank unit (``sparkrig-head`` / ``sparkrig-worker``: the image, the
weights, the serve flags) and its stop-together unit (``sparkrig-pair``). A change to either
restarts the whole pair in order (sparkrig/pairrestart.py; tasks/stop.py and tasks/start.py)."""

from pyinfra.operations import systemd

from sparkrig.config.inventory import current
from sparkrig.helperunits import pair_unit_context
from sparkrig.image import serving_image
from sparkrig.owned import file_present
from sparkrig.pairrestart import pair_restart
from sparkrig.paths import paths
from sparkrig.render import render
from sparkrig.serving import rank_unit_context, weights_id

settings = current()
host_paths = paths(settings)
weights = weights_id(settings)
image = serving_image(settings)  # the patched image every rank runs (tasks/image.py builds it)
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
