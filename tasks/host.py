"""Phase 2, host: docker (and its socket) enabled and running before anything needs it;
vm.swappiness=0 (and an equal vm.min_free_kbytes) in a sysctl.d file this tool owns, applied at
once; the host package (files/sparkhost: the start gate, the fetcher, the stop-together helpers,
the gates), one owned file per module (sparkrig/hostpkg.py)."""

from pyinfra import host
from pyinfra.operations import server

from sparkrig import hostpkg, hoststate
from sparkrig.config.inventory import current
from sparkrig.node import SYSCTL_FILE
from sparkrig.owned import (
    UnitNames,
    directory_owned,
    file_present,
    program_installed,
    unit_owned,
    unit_state_set,
)
from sparkrig.paths import paths
from sparkrig.render import render

settings = current()
knobs = settings.knobs
node = hoststate.read(settings).node

# An apt upgrade of docker-ce, dockerd killed, or an operator can leave docker stopped; the image
# and service phases need it (docs/docker.md). The state read says so before anything runs.
if not hoststate.read(settings).docker_running():
    host.log("docker not running (docker.service or docker.socket inactive): this run starts it")
for docker_unit in host.loop(list(hoststate.DOCKER_UNITS)):
    unit_state_set(
        name="Run docker and its socket, enabled",
        service=docker_unit,
        running=True,
        enabled=True,
    )

sysctl = file_present(
    name="Own the sparkrig sysctl file",
    text=render(
        "sysctl.conf.j2", swappiness=knobs.swappiness, min_free_kbytes=knobs.min_free_kbytes
    ),
    dest=SYSCTL_FILE,
)
live_drift = node.swappiness != knobs.swappiness or (
    knobs.min_free_kbytes is not None and node.min_free_kbytes != knobs.min_free_kbytes
)
server.shell(
    name="Apply the sparkrig sysctl file",
    commands=[f"sysctl -p {SYSCTL_FILE}"],
    _if=lambda: sysctl.did_change() or live_drift,
)

directories = [
    knobs.install_dir,
    paths(settings).bin_dir,
    *hostpkg.remote_dirs(knobs.install_dir),
]
for directory in host.loop([*directories, knobs.config_dir]):
    directory_owned(name="Create sparkrig directories", path=directory, mode="755")
package = hostpkg.remote_dir(knobs.install_dir)
shipped = {
    module: program_installed(
        name="Install the host package (files/sparkhost)",
        src=f"files/sparkhost/{module}",
        dest=f"{package}/{module}",
    )
    for module in host.loop(hostpkg.modules())
}
hostpkg.shipped(shipped)  # the service phase restarts the helpers whose modules changed

# Opt-in GPU clock cap (knob gpu_clock_max_mhz, reported to stop overheat shutdowns during long
# prefills): a oneshot unit applies `nvidia-smi -lgc 0,<MHz>` at every boot, ordered before the
# rank unit, and now; switched off, it is stopped (its ExecStop resets the clocks) and removed.
unit_owned(
    service="sparkrig-gpu-clock",
    dest=paths(settings).gpu_clock_unit,
    text=render(
        "sparkrig-gpu-clock.service.j2", unit=settings.unit_name, mhz=knobs.gpu_clock_max_mhz
    )
    if knobs.gpu_clock_max_mhz is not None
    else None,
    names=UnitNames(
        install="Install the GPU clock lock unit",
        restart="Apply the GPU clock lock after its unit changed",
        keep="Keep the GPU clock lock applied and enabled at boot",
        stop="Stop the GPU clock lock while it is switched off",
        remove="Remove the GPU clock lock unit while it is switched off",
    ),
)
