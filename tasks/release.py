"""Phase 1b, release: when the release (stack, image, model/drafter revision, profile) changes,
keep the serving release's files as ``*.prev`` before any phase rewrites them, so a failed
upgrade can be rolled back (tasks/verify.py); its image and weights revision stay until the new
release passes the gates. An upgrade needs the whole pair: refused, before anything changes,
without the head."""

from pyinfra import host, inventory, logger

from sparkrig import hoststate
from sparkrig.config.inventory import current, for_inventory
from sparkrig.failing import problems_absent
from sparkrig.ordering import in_this_run
from sparkrig.release import change, rolling_refusal
from sparkrig.rollback import previous_kept

settings = current()
record = hoststate.read(settings).release
release_change = change(settings, record)
head_in_run = in_this_run(settings.head.name)

found = []
if record.error:
    logger.warning(f"{host.print_prefix}{record.error}: no rollback until a run passes the gates")
if release_change:
    logger.info(
        f"{host.print_prefix}release changes ({release_change}): the previous release is kept and "
        "rolled back to if the new one fails to boot or fails a gate"
    )
    if not head_in_run:
        found.append(
            f"the release changes ({release_change}): an upgrade restarts the whole pair and rolls "
            "it back if it fails; run `pyinfra inventory.py deploy.py` with the head (no --limit)"
        )
problems_absent(
    name="Refuse an upgrade of half a pair",
    problems=found,
    heading="release",
    passed="no upgrade without the head",
)
# Behind one endpoint a release goes one pair at a time (`python3 -m sparkrig roll`): a run
# that would take several serving pairs to a new release at once is refused, before any change.
if settings.other_heads:
    everyone = for_inventory(inventory)
    heads = [everyone[h.name] for h in settings.pair_heads if in_this_run(h.name)]
    changing = [h.pair for h in heads if change(h, hoststate.read(h).release)]
    problems_absent(
        name="Refuse a release change of several serving pairs at once",
        problems=[rolling_refusal(changing)] if len(changing) > 1 else [],
        heading="release",
        passed="a release change rolls one pair at a time",
    )
serving = record.serving
previous_kept(
    name="Keep the serving release's unit and lockfiles until the new release passes the gates",
    files=list(serving.files) if release_change and serving is not None else [],
)
