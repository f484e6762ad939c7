"""Phase 2, host: docker (and its socket) enabled and running before anything needs it;
vm.swappiness=0 (and an equal vm.min_free_kbytes) in a sysctl.d file this tool owns, applied at
once; the host package (files/sparkhost: the start gate, the fetcher, the stop-together helpers,
the gates), one owned file per module (sparkrig/hostpkg.py)."""

from pyinfra import host
from pyinfra.operations import server

from sparkrig import hostpkg, hoststate
from sparkrig.host import SYSCTL_FILE
from sparkrig.owned import owned_directory, program, put_text, service
from sparkrig.paths import paths
from sparkrig.render import render
from sparkrig.settings import current

s = current()
k = s.knobs
node = hoststate.read(s).node

# An apt upgrade of docker-ce, dockerd killed, or an operator can leave docker stopped; the image
# and service phases need it (docs/docker.md). The state read says so before anything runs.
if not hoststate.read(s).docker_running():
    host.log("docker not running (docker.service or docker.socket inactive): this run starts it")
for docker_unit in host.loop(list(hoststate.DOCKER_UNITS)):
    service(
        name="Run docker and its socket, enabled",
        service=docker_unit,
        running=True,
        enabled=True,
    )

sysctl = put_text(
    name="Own the sparkrig sysctl file",
    text=render("sysctl.conf.j2", swappiness=k.swappiness, min_free_kbytes=k.min_free_kbytes),
    dest=SYSCTL_FILE,
)
live_drift = node.swappiness != k.swappiness or (
    k.min_free_kbytes is not None and node.min_free_kbytes != k.min_free_kbytes
)
server.shell(
    name="Apply the sparkrig sysctl file",
    commands=[f"sysctl -p {SYSCTL_FILE}"],
    _if=lambda: sysctl.did_change() or live_drift,
)

directories = [k.install_dir, paths(s)["bin_dir"], *hostpkg.remote_dirs(k.install_dir)]
for directory in host.loop([*directories, k.config_dir]):
    owned_directory(name="Create sparkrig directories", path=directory, mode="755")
package = hostpkg.remote_dir(k.install_dir)
shipped = {
    module: program(
        name="Install the host package (files/sparkhost)",
        src=f"files/sparkhost/{module}",
        dest=f"{package}/{module}",
    )
    for module in host.loop(hostpkg.modules())
}
hostpkg.shipped(shipped)  # the service phase restarts the helpers whose modules changed
