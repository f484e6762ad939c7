"""Phase 4, weights: the checkpoint (and the drafter, when the profile needs it) on every rank,
sha256-verified against lockfiles made on the control machine (python3 -m sparkrig.lockfile).

The head fetches from the Hub with one lane per uplink interface; every worker then copies from
the head over the fabric (the head serves its verified directory read-only for the duration), so
nothing crosses the internet twice. Re-runs confirm the files from stamps in well under a second."""

from typing import Any

from pyinfra import host, inventory
from pyinfra.operations import server
from sparkhost.lockfile import installed_path

from sparkrig import hostpkg, hoststate, stackfiles
from sparkrig.config.inventory import current, for_inventory
from sparkrig.ordering import in_this_run, on_head, on_workers
from sparkrig.owned import directory_owned, file_present, secret_installed
from sparkrig.pairrestart import pair_restart
from sparkrig.paths import paths
from sparkrig.revisiondirs import LEGACY_DIRS, weights_adopted
from sparkrig.stackfiles import stack_file_present
from sparkrig.weights import (
    Artifact,
    artifacts,
    token_text,
    transient_unit_started,
    weights_present,
    weights_rehashed,
)

settings = current()
knobs = settings.knobs
host_paths = paths(settings)
fetcher = hostpkg.invocation(knobs.install_dir)  # + fetch, verify, serve, follow (tasks/host.py)

for directory in host.loop([knobs.weights_dir, knobs.cache_dir]):
    directory_owned(name="Create the weights and cache directories", path=directory, mode="755")

# Weights live per revision (<weights_dir>/<name>-<commit>) so an upgrade keeps the previous
# revision for a rollback; a checkout of the old layout is renamed in place (nothing fetched),
# before a new lockfile replaces the one that names its revision.
for legacy in host.loop(LEGACY_DIRS):
    weights_adopted(
        name="Adopt a weights checkout of the old layout as its revision's directory",
        weights_dir=knobs.weights_dir,
        artifact=legacy,
        lock=installed_path(knobs.config_dir, legacy),
    )
wanted = artifacts(settings)  # lockfiles read and checked on the control machine
for art in host.loop(wanted):
    file_present(name="Install the weights lockfiles", text=art.lock_text, dest=art.remote_lock)

is_head = settings.me.is_head
full = knobs.weights_verify == "full"
# The Hub token is the control machine's (HF_TOKEN, else `hf auth login`'s file). The head gets it
# only while it fetches a gated repo (a public one needs none), written through stdin 0600
# (sparkrig/secretio.py), and it is removed once the fetch is done: it never rests on the head.
token = token_text()


def fetches_gated() -> bool:
    """The head fetches a gated artifact in this run: it lacks files of its pinned revision (or
    re-hashes them all, weights_verify = full)."""
    here = hoststate.read(settings)
    for art in wanted:
        held = here.weights_of(art.remote_lock)
        if art.gated and (full or not (held.commit == art.commit and held.complete)):
            return True
    return False


needs_token = token is not None and is_head and fetches_gated()
token_installed = on_head(
    is_head,
    secret_installed,
    name="Install the Hub token for a gated repo's fetch",
    text=token or "\n",
    dest=host_paths.token_file,
    _if=lambda: needs_token,
)
source_token = ["--token-file", host_paths.token_file] if needs_token else []

# Every operation below exists on every host (acting only where its condition holds), so all
# hosts share one sequence: the head fetches, serves, the workers copy, the head stops serving.
head_in_run = in_this_run(settings.head.name)

# weights_verify = "full": every rank re-hashes its files first (preflight refused it beside a
# serving rank); only files that fail are fetched again below, so a healthy pair is not restarted.
for art in host.loop(wanted):
    weights_rehashed(
        name="Re-hash every weights file (weights_verify = full)",
        fetcher=fetcher,
        lock=art.remote_lock,
        dest=art.dest,
        _if=lambda: full,
    )

lanes = [f"--uplink={i}" for i in settings.me.uplink_interfaces] or ["--uplink=default"]
two_lanes = len(settings.me.uplink_interfaces) > 1
# the tables an older sparkrig's fetch left lacked the uplink's own subnet, so the host's answers
# to a LAN neighbour went to the gateway (files/sparkhost/routes.py): put it there. On every host
# (one sequence for all), acting where a fetch binds two uplinks.
routes_changed = hostpkg.changed("routes")
server.shell(
    name="Repair the uplink policy tables after the routes program changed",
    commands=[" ".join(hostpkg.command(knobs.install_dir, "routes", *lanes, "--repair"))],
    _if=lambda: two_lanes and routes_changed(),
)
if two_lanes:
    lanes.append("--install-routes")  # per uplink: table 10N + "from <ip> lookup 10N" rule


def artifact_args(art: Artifact) -> dict[str, Any]:
    """``weights_present``'s arguments of one artifact, wherever its bytes come from."""
    return {
        "fetcher": fetcher,
        "lock": art.remote_lock,
        "dest": art.dest,
        "unit": f"sparkrig-fetch-{art.name}",
        "commit": art.commit,
        "total_files": art.total_files,
        "total_bytes": art.total_bytes,
    }


for art in host.loop(wanted):
    fetched = on_head(
        is_head,
        weights_present,
        name="Fetch and verify the weights on the head",
        source=["--endpoint", knobs.hub_endpoint, *lanes, *source_token],
        **artifact_args(art),
    )
    pair_restart().trigger("weights", fetched)


# The fetch is over (or failed the run): the token goes, as does one an earlier deploy left.
left_over = is_head and hoststate.read(settings).file(host_paths.token_file) is not None
on_head(
    is_head,
    server.shell,
    name="Remove the Hub token after the fetch",
    commands=[f"rm -f {host_paths.token_file}"],
    _if=lambda: token_installed.did_change() or left_over,
)

# Serve the verified files to the workers only when one of them lacks something (judged again
# when it runs after a full re-hash, which may have found a worker's file bad).
everyone = for_inventory(inventory)


def workers_lack() -> bool:
    """A worker of this run lacks a verified file (one left out by --limit is never reached)."""
    return any(
        not hoststate.read(everyone[w.name]).weights_of(a.remote_lock).complete
        for w in settings.workers
        if in_this_run(w.name)
        for a in wanted
    )


lacking = is_head and workers_lack()
serving = on_head(
    is_head,
    transient_unit_started,
    name="Serve the verified weights to the workers over the fabric",
    unit="sparkrig-weights-serve",
    command=[
        *fetcher, "serve", "--dir", knobs.weights_dir,
        "--listen", settings.listen_on(knobs.copy_port),
        *(["--bind-device", settings.helper_device] if settings.helper_device else []),
        "--max-seconds", "86400",
        # only the pinned revisions' lockfile files, nothing else of weights_dir
        *[f"--lock-in={art.subdir}={art.remote_lock}" for art in wanted],
    ],
    _if=lambda: workers_lack() if full else lacking,
)  # fmt: skip
for art in host.loop(wanted):
    copied = on_workers(
        is_head,
        weights_present,
        name="Copy and verify the weights from the head over the fabric",
        source=[
            "--base-url", f"http://{settings.dial(settings.head)}:{knobs.copy_port}/{art.subdir}",
            # bound to the fabric netdev, else (a triangle, a ring) the way the routes say
            f"--uplink={settings.helper_device or 'default'}", "--no-bind-src", "--streams", "4",
        ],
        **artifact_args(art),
        source_absent=""
        if head_in_run
        else f"the head ({settings.head.name}) serves the weights to the workers and is not in "
        "this run: run `pyinfra inventory.py deploy.py` with the head (no --limit)",
    )  # fmt: skip
    pair_restart().trigger("weights", copied)
on_head(
    is_head,
    server.shell,
    name="Stop serving the weights",
    commands=["systemctl stop sparkrig-weights-serve"],
    _if=serving.did_change,
)

# The stack's own files (sparkrig/stackfiles.py: e.g. sfxnz-v13's chat template), fetched by the
# head at their pinned commits; head-only, so no worker gets them. None for most stacks: then no
# operation at all (the stack is the same on every host, so is this sequence).
for stack_file in host.loop(list(settings.stack.files)):
    on_head(
        is_head,
        stack_file_present,
        name="Fetch the stack's file on the head at its pinned commit",
        f=stack_file,
        dest=stackfiles.host_path(settings, stack_file),
    )
