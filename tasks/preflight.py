"""Phase 1, preflight: validate every host's data first (bad input stops the run before any
command reaches a host), report each node, and refuse a host that cannot be converged before
anything on it changes."""

from pyinfra import host, inventory, logger, state

from sparkrig import baseline, hoststate, stackfiles
from sparkrig.config.inventory import current, for_inventory
from sparkrig.fabric import lan_problems
from sparkrig.failing import problems_absent
from sparkrig.front import front_paths, key_include_lost
from sparkrig.fronttls import pair_tls
from sparkrig.image import serving_tag
from sparkrig.node import clock_problems
from sparkrig.ordering import in_this_run
from sparkrig.pairsecret import api_key, pair_secret
from sparkrig.ports import port_problems
from sparkrig.preflight import describe, fetch_summary, problems, warnings
from sparkrig.reach import Reach, reach_problems, wanted_urls
from sparkrig.release import change
from sparkrig.revisiondirs import adoptable
from sparkrig.weights import Artifact, artifacts

settings = current()
node = hoststate.read(settings).node  # this host's one state read, kept for every phase
peers = {}
if settings.me.is_head:  # the head compares itself with the workers (drivers, vm.min_free_kbytes)
    everyone = for_inventory(inventory)
    peers = {
        w.name: hoststate.read(everyone[w.name]).node
        for w in settings.workers
        if in_this_run(w.name)  # --limit: never reached
    }

logger.info(f"{host.print_prefix}rank {settings.me.rank}: {describe(node)}")
for warning in warnings(settings, node, peers):
    logger.warning(f"{host.print_prefix}{warning}")

# The agents' secret: the pair's own, unless no rank holds one or the operator rotates it.
secret = pair_secret(settings, hoststate.values)
if secret.warning:
    logger.warning(f"{host.print_prefix}{secret.warning}")
if secret.source:
    logger.info(f"{host.print_prefix}agents' secret: {secret.source}")
# The API key: the head's own, decided only when the head is in the run (said on the head).
api = api_key(settings, hoststate.values)
if api is not None and api.warning and settings.me.is_head:
    logger.warning(f"{host.print_prefix}{api.warning}")
if api is not None and api.source and settings.me.is_head:
    logger.info(f"{host.print_prefix}API key: {api.source}")
# The front's certificate from the pair's CA on the control side (made or issued when needed).
tls = pair_tls(settings, hoststate.values) if settings.me.is_head else None
if tls is not None and tls.said:
    logger.info(f"{host.print_prefix}API front's TLS: {tls.said}")


# The weights' bytes still to fetch here, from the lockfiles: a checkout already verified at the
# pinned revisions needs none (verified files are subtracted), nor one of the old layout the
# weights phase renames (its lockfile is the pinned one); a host that cannot say (first deploy,
# another revision) needs the lockfile's whole size.
def to_fetch(art: Artifact) -> int:
    here = hoststate.read(settings)
    held = here.weights_of(art.remote_lock)
    if held.ok and held.commit == art.commit:
        return 0 if held.complete else held.bytes_to_fetch
    return 0 if adoptable(art, here.file(art.remote_lock), here.release) else art.total_bytes


fetch_bytes = {art.name: to_fetch(art) for art in artifacts(settings)}
if sum(fetch_bytes.values()):
    logger.info(f"{host.print_prefix}weights still to fetch: {fetch_summary(fetch_bytes)}")
# During a release change (a stack switch, a new revision) the serving release's weights stay
# until the new one passes: already on the disk, so free space counts them; the refusal says so.
record = hoststate.read(settings).release
kept = record.serving.label() if change(settings, record) and record.serving else ""
found = problems(settings, node, peers, weights_to_fetch=sum(fetch_bytes.values()), kept=kept)
# The ranks' clocks, every rank of the run against every other (the helpers' signed calls go
# between them): each host refuses the same skew, so no rank is converged alone.
in_run = [r for r in settings.ranks if inventory.get_host(r.name) in state.activated_hosts]
found += clock_problems(
    {r.name: hoststate.read(for_inventory(inventory)[r.name]).clock for r in in_run}
)
# The head's reach of the Hub and the image registry, asked only when it must download from
# them (one command more then; a converged pair needs no internet and is never asked).
base = settings.image_ref
if settings.me.is_head and settings.knobs.reach_check:
    held_image = hoststate.read(settings).image_of(
        image_repo=settings.knobs.image_repo, base_image=base, tag=serving_tag(settings)
    )
    wanted = wanted_urls(
        settings,
        weights_missing=sum(fetch_bytes.values()) > 0,
        image_missing=held_image.needs_registry(base),
        archive=hoststate.read(settings).front_archive,
    )
    wanted.update(stackfiles.wanted_urls(settings))  # the stack's files the head still lacks
    if wanted:
        reached = host.get_fact(Reach, urls=tuple(wanted), _ignore_errors=True)
        found += reach_problems(wanted, reached)

# a triangle or a ring meets at the head's LAN address: each rank's lan_address is its own
if settings.relayed:
    found += lan_problems(settings, hoststate.read(settings).lan_addresses)
ports = hoststate.read(settings).ports  # free, or held by sparkrig's own units and containers
found += port_problems(settings, ports)
if not ports.checked:
    logger.warning(f"{host.print_prefix}ports not checked: ss (iproute2) is not installed")
found += [secret.problem] if secret.problem else []
found += [api.problem] if api is not None and api.problem else []
found += [tls.problem] if tls is not None and tls.problem else []
# The front's key include (head only): missing while the head's key is known by digest only.
include = (
    hoststate.read(settings).file(front_paths(settings)["key_include"])
    if settings.me.is_head
    else None
)
lost = key_include_lost(settings, api, include)
found += [lost] if lost else []

# The host baseline (sparkrig/baseline.py): every rank of the run on one kernel, driver and NIC
# firmware, none on a known-bad combination. Each rank's read is shared: no command more.
everyone = for_inventory(inventory)
in_run = [r for r in settings.ranks if in_this_run(r.name)]
mine = hoststate.read(settings).baseline
logger.info(f"{host.print_prefix}baseline: {baseline.describe(mine)}")
ranks = {r.name: hoststate.read(everyone[r.name]).baseline for r in in_run}
table = baseline.mismatch(ranks, [r.name for r in in_run])
if table and not settings.knobs.baseline_mismatch_ok:
    found.append(table)
elif table:
    logger.warning(f"{host.print_prefix}{table} (accepted: baseline_mismatch_ok)")
if not settings.knobs.baseline_known_bad_ok:
    found += baseline.known_bad(settings, mine)
recorded = hoststate.read(settings).release.serving
moved = baseline.drift(dict(recorded.baseline), mine) if recorded is not None else []
if moved:
    logger.warning(
        f"{host.print_prefix}baseline moved since the gates last passed: {'; '.join(moved)} "
        "(recorded again once the gates pass on it)"
    )

# weights_verify = "full" re-hashes ~181 GiB through the page cache: never beside a serving rank
# (hard power-offs while sha256sum flooded the page cache: docs/sources.md, "Memory gate").
if settings.knobs.weights_verify == "full":
    unit = f"{settings.unit_name}.service"
    if hoststate.read(settings).unit(unit)[0]:
        found.append(
            f"weights_verify = 'full' re-hashes every weights file through the page cache and "
            f"{unit} is serving: stop the pair first (on the head: `sudo systemctl stop "
            f"{settings.head_unit_name}`, the workers follow), then run again"
        )
problems_absent(name="Refuse a host that fails preflight", problems=found)
