"""`pyinfra inventory.py uninstall.py`: take sparkrig off every rank. `--dry --diff` shows it.

The pair stops in order, as the deploy's ordered restart stops it (tasks/pair_stop.py): the head's
supervisor and watchdog first, so nothing starts a rank again, then every rank. Then everything
sparkrig owns goes: its units, env and secret files, lockfiles, the sysctl.d file, the kho=off GRUB
drop-in (then update-grub; the baseline's package holds stay), the firewall's table inet sparkrig
(its unit stopped, which leaves the table, then the table deleted; the ruleset file goes with
config_dir), the drop-ins beside the units and nginx.service, the fabric netplan file (then the
fabric profiles are generated and reloaded the way tasks/fabric.py applies them, so NetworkManager
drops sparkrig's connection and the NIC is unconfigured again), the helper programs under
install_dir, the JIT caches and the image transfer directory, every image of image_repo and every
base image the head pulled (its pulled-images record: each stack's, not only the current one). The
head's API front goes: its nginx site and restart drop-in (nginx reloads, or stops when sparkrig
installed it; the package stays), the key include and TLS pair with config_dir. The weights stay
unless `--data purge_weights=True`. Files that fabric_takeover moved aside stay where they are
(/var/lib/sparkrig/displaced), for the operator to move back. Live sysctl values stay until the
next boot. A deploy afterwards converges again."""

import shlex
from pathlib import PurePosixPath

from pyinfra import host, logger
from pyinfra.facts.files import FileContents
from pyinfra.operations import files, server, systemd

from sparkrig import firewall
from sparkrig.baseline import GRUB_DROPIN
from sparkrig.config.inventory import current
from sparkrig.fabric import DISPLACED_DIR, FORWARDING_FILE, RELAY_UNIT, RELAY_UNIT_FILE
from sparkrig.front import INSTALLED_MARK, RESTART_DROPIN, SITE
from sparkrig.image import ImageState, serving_tag
from sparkrig.imagebuild import old_images_pruned, prune_commands
from sparkrig.node import SYSCTL_FILE
from sparkrig.paths import paths
from sparkrig.rollback import PREV
from tasks.pair_stop import pair_stopped_in_order

settings = current()
knobs = settings.knobs
host_paths = paths(settings)
is_head = settings.me.is_head

# The pair stops as the deploy's ordered restart stops it (tasks/pair_stop.py): the head's
# supervisor and watchdog first, so neither starts a rank again, then every rank; all disabled.
pair_stopped_in_order(
    settings,
    helpers=[
        ("Stop the head's supervisor and watchdog", unit, None)
        for unit in ("sparkrig-supervisor", "sparkrig-watchdog")
    ],
    ranks=("Stop every rank (the head's supervisor and watchdog are stopped)", None),
    enabled=False,
)
for helper in host.loop(["sparkrig-pair", "sparkrig-agent"]):
    systemd.service(name="Stop the stop-together watch and the agent", service=helper,
                    running=False, enabled=False)  # fmt: skip

# a ring's relay: its stop deletes its DOCKER-USER rules
systemd.service(name="Stop the fabric relay's DOCKER-USER rules", service=RELAY_UNIT,
                running=False, enabled=False)  # fmt: skip
systemd.service(name="Stop the GPU clock lock (its stop resets the clocks)",
                service="sparkrig-gpu-clock", running=False, enabled=False)  # fmt: skip
# The firewall last of the units (the ranks and helpers that require it are stopped): its stop
# deletes nothing, so the table inet sparkrig is deleted here, as is one loaded without its unit.
# Docker's tables and the rest of the ruleset stay.
systemd.service(name="Stop the sparkrig firewall (its stop leaves the table)",
                service=firewall.UNIT, running=False, enabled=False)  # fmt: skip
table_loaded = host.get_fact(firewall.FirewallState).loaded
server.shell(
    name="Delete the firewall table",
    commands=[
        f"if nft list table {firewall.TABLE} >/dev/null 2>&1; "
        f"then nft delete table {firewall.TABLE}; fi"
    ],
    _if=lambda: table_loaded,
)

units = [
    host_paths.rank_unit,
    host_paths.pair_unit,
    host_paths.agent_unit,
    host_paths.supervisor_unit,
    host_paths.watchdog_unit,
]
units.append(host_paths.gpu_clock_unit)
units.append(firewall.UNIT_FILE)
units.append(RELAY_UNIT_FILE)
units.append(host_paths.rank_unit + PREV)  # the previous release's unit, kept by an upgrade
# the drop-ins: the firewall's Requires= beside the rank and its helpers, the front's restart
# beside nginx.service (the head's; absent on a worker)
dropins = [*firewall.requires_dropins(settings), RESTART_DROPIN]
units += dropins
removed = [
    files.file(name="Remove the sparkrig units", path=unit, present=False)
    for unit in host.loop(units)
]
# A rank stopped with its peer gone exits non-zero (the worker's vLLM exits 1 on "peer lost"), so
# systemd keeps it loaded as failed after its file went: `systemctl --failed` would list it. A
# drop-in's directory goes when nothing is left in it (an operator's own drop-in keeps it).
dropin_dirs = " ".join(sorted({shlex.quote(str(PurePosixPath(d).parent)) for d in dropins}))
server.shell(
    name="Reload systemd after the units went and forget their failed state",
    commands=[
        f'for d in {dropin_dirs}; do [ ! -d "$d" ] || rmdir --ignore-fail-on-non-empty "$d"; done',
        "systemctl daemon-reload",
        "systemctl reset-failed 'sparkrig-*'",
    ],
    _if=lambda: any(r.did_change() for r in removed),
)

files.file(name="Remove the sparkrig sysctl file", path=SYSCTL_FILE,
           present=False)  # fmt: skip
files.file(name="Remove the fabric forwarding settings", path=FORWARDING_FILE,
           present=False)  # fmt: skip
# kho=off stays on the running command line until the next boot; the package holds stay (release
# them first with `deploy.py --data accept_baseline=True`: sparkrig/baseline.py, docs/baseline.md)
grub = files.file(name="Remove the kho=off GRUB drop-in", path=GRUB_DROPIN, present=False)
server.shell(
    name="Regenerate the GRUB menu without the drop-in (next boot)",
    commands=["update-grub"],
    _if=grub.did_change,
)
netplan = files.file(
    name="Remove the fabric netplan file", path=knobs.fabric_netplan_file, present=False
)
# As tasks/fabric.py applies it (never `netplan apply`): render, let NetworkManager re-read; the
# fabric's netplan profile is gone, and deleting an active profile takes its device down (an active
# device must always have a profile: linux-system-roles/network#35), so the NIC is unconfigured.
server.shell(
    name="Let NetworkManager drop the fabric connection",
    commands=["netplan generate", "nmcli connection reload"],
    _if=netplan.did_change,
)

# The API front (sparkrig/front.py): the site goes, then nginx reloads without it, or stops and is
# disabled when sparkrig installed it (its mark); the package itself stays. The key include and the
# TLS pair live in config_dir, removed below.
site = files.file(name="Remove the API front's nginx site", path=SITE, present=False)
server.shell(
    name="Reload or stop nginx without the API front",
    commands=[
        f"if [ -e {INSTALLED_MARK} ]; then systemctl disable --now nginx.service; "
        f"rm -f {INSTALLED_MARK}; elif systemctl is-active --quiet nginx.service; then "
        "nginx -t -q && systemctl reload nginx.service; fi"
    ],
    _if=site.did_change,
)

old_images_pruned(
    name="Remove every image of the sparkrig image repository", image_repo=knobs.image_repo, keep=[]
)
# The head pulled each base by its digest: that reference keeps it after its local tag is gone.
# Every one it pulled is in its pulled-images record (each stack's, every release's), and the
# current one also when it was pulled before the record existed.
base = settings.image_ref
tag = serving_tag(settings)
pulled = host.get_fact(ImageState, image_repo=knobs.image_repo, base_image=base, tag=tag).ref
recorded = host.get_fact(FileContents, path=host_paths.pulled_images) or []
bases = sorted({ref.strip() for ref in recorded if ref.strip()} | ({base} if pulled else set()))
server.shell(
    name="Remove every base image pulled by its digest",
    commands=prune_commands(bases, keep=[]),
    _if=lambda: bool(bases),
)

gone = [
    knobs.config_dir,
    knobs.install_dir,
    knobs.cache_dir,
    knobs.image_transfer_dir,
    host_paths.run_dir,
]
if knobs.purge_weights:
    gone.append(knobs.weights_dir)
for directory in host.loop(gone):
    files.directory(name="Remove the sparkrig directories", path=directory, present=False)
if not knobs.purge_weights:
    logger.info(
        f"{host.print_prefix}weights kept in {knobs.weights_dir} (purge_weights=True removes them)"
    )
logger.info(f"{host.print_prefix}kept: {DISPLACED_DIR}, what fabric_takeover moved aside")
