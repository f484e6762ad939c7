"""Phase 2, host: vm.swappiness=0 (and an equal vm.min_free_kbytes) in a sysctl.d file this tool
owns, applied at once; the host package (files/sparkhost: the start gate, the fetcher, the
stop-together helpers, the gates), one owned file per module (sparkrig/hostpkg.py)."""

from pyinfra import host
from pyinfra.operations import server

from sparkrig import hostpkg, hoststate
from sparkrig.node import SYSCTL_FILE
from sparkrig.owned import owned_directory, program, put_text
from sparkrig.paths import paths
from sparkrig.render import render
from sparkrig.settings import current

settings = current()
knobs = settings.knobs
node = hoststate.read(settings).node

sysctl = put_text(
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
    paths(settings)["bin_dir"],
    *hostpkg.remote_dirs(knobs.install_dir),
]
for directory in host.loop([*directories, knobs.config_dir]):
    owned_directory(name="Create sparkrig directories", path=directory, mode="755")
package = hostpkg.remote_dir(knobs.install_dir)
shipped = {
    module: program(
        name="Install the host package (files/sparkhost)",
        src=f"files/sparkhost/{module}",
        dest=f"{package}/{module}",
    )
    for module in host.loop(hostpkg.modules())
}
hostpkg.shipped(shipped)  # the service phase restarts the helpers whose modules changed
