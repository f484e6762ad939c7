"""Phase 6, service, 7 of 7: the programs of an earlier sparkrig, before the host package: every
unit of the service phase now runs the package, so nothing starts them any more. Kept while the
release changes: a rollback puts the previous release's rank unit back (sparkrig/rollback.py), and
one from before the package runs them; the first run without a release change removes them."""

from pyinfra import host

from sparkrig import hostpkg, hoststate
from sparkrig.config.inventory import current
from sparkrig.owned import file_absent
from sparkrig.release import change

settings = current()
upgrading = bool(change(settings, hoststate.read(settings).release))
for legacy in host.loop(hostpkg.legacy_files(settings.knobs.install_dir)):
    file_absent(
        name="Remove the programs the host package replaced",
        path=legacy,
        _if=lambda: not upgrading,
    )
