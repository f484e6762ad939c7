"""Phase 2, host: vm.swappiness=0 (and an equal vm.min_free_kbytes) in a sysctl.d file this tool
owns, applied at once; the start gate that drops caches and checks MemFree before every start."""

from pyinfra import host
from pyinfra.operations import server

from sparkrig import hoststate
from sparkrig.host import SYSCTL_FILE
from sparkrig.owned import owned_directory, program, put_text
from sparkrig.paths import paths
from sparkrig.render import render
from sparkrig.settings import current

s = current()
k = s.knobs
node = hoststate.read(s).node

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

for directory in host.loop([k.install_dir, paths(s)["bin_dir"], k.config_dir]):
    owned_directory(name="Create sparkrig directories", path=directory, mode="755")
program(
    name="Install the start gate (drop caches, MemFree, fabric and GID check)",
    src="files/sparkrig_prep.py",
    dest=f"{paths(s)['bin_dir']}/sparkrig-prep",
)
