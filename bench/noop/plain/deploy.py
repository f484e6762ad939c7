"""The plain 20-operation pyinfra deploy (docs/sources.md), the yardstick for sparkrig's no-op:
a sysctl.d file, a netplan file, a templated unit enabled and restarted on change, a templated
file, a synced directory of 5 files (plus the directories they need). Only pyinfra built-ins.

Run from bench/noop/plain (paths are relative): see bench/noop/README.md."""

from pyinfra import host
from pyinfra.operations import files, server, systemd

base = "/opt/bench-plain"

for directory in host.loop([base, f"{base}/etc", f"{base}/sync", "/etc/netplan"]):
    files.directory(name="Create the bench directories", path=directory, mode="755")

sysctl = files.put(
    name="Own the bench sysctl file",
    src="files/90-bench.conf",
    dest="/etc/sysctl.d/90-bench.conf",
    mode="644",
)
server.shell(
    name="Apply the bench sysctl file",
    commands=["sysctl -p /etc/sysctl.d/90-bench.conf"],
    _if=sysctl.did_change,
)
files.put(
    name="Own the bench netplan file (not applied)",
    src="files/99-bench.yaml",
    dest="/etc/netplan/99-bench.yaml",
    mode="600",
)
unit = files.template(
    name="Install the bench unit",
    src="templates/bench.service.j2",
    dest="/etc/systemd/system/bench.service",
    base=base,
)
systemd.daemon_reload(name="Reload systemd after the bench unit changed", _if=unit.did_change)
systemd.service(
    name="Keep the bench unit enabled and running",
    service="bench.service",
    running=True,
    enabled=True,
)
systemd.service(
    name="Restart the bench unit after it changed",
    service="bench.service",
    restarted=True,
    _if=unit.did_change,
)
files.template(
    name="Render the bench config",
    src="templates/bench.conf.j2",
    dest=f"{base}/etc/bench.conf",
    host_name=host.name,
)
files.sync(name="Sync the bench directory (5 files)", src="files/sync", dest=f"{base}/sync")
for name in host.loop(["a", "b", "c", "d", "e"]):
    files.line(
        name="Keep one line per bench marker",
        path=f"{base}/etc/markers",
        line=f"marker-{name}",
    )
files.link(name="Link the bench config", path=f"{base}/bench.conf", target=f"{base}/etc/bench.conf")
