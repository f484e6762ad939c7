"""Phase 5, image: the serving image on every node, from the stack's image pinned by digest.

Only the head pulls the base image from its registry; it saves it and serves it read-only on its
fabric address while the workers copy it (their layers checked against the head's after
`docker load`), so nothing crosses the internet twice. Every node then builds
`<image_repo>:<content hash>` from files/ without network; a present tag is never rebuilt. A
stack without sparkrig's patch layer (``Stack.patched`` False) runs the pulled image as it is."""

from pyinfra import host, inventory

from sparkrig import hostpkg, hoststate
from sparkrig.config.inventory import current, for_inventory
from sparkrig.image import ImageReport, describe, serving_tag
from sparkrig.imagebuild import patched_image_built
from sparkrig.imagecopy import (
    base_image_loaded,
    base_image_pulled,
    base_image_served,
    base_image_unserved,
    copy_plan,
)
from sparkrig.ordering import in_this_run, on_head, on_workers
from sparkrig.paths import paths

settings = current()
knobs = settings.knobs
base = settings.image_ref
tag = serving_tag(settings)
is_head = settings.me.is_head


def _state(name: str) -> ImageReport:
    return hoststate.read(for_inventory(inventory)[name]).image_of(
        image_repo=knobs.image_repo, base_image=base, tag=tag
    )


# The head judges every worker's base image against its own (layers, not image IDs) before
# anything runs, as the weights phase does; workers never read the head (--limit worker).
missing: list[str] = []
mismatched: list[str] = []
if is_head:
    mine = _state(settings.me.name)
    workers = {  # the workers of this run: one left out by --limit is never reached
        w.name: _state(w.name) for w in settings.workers if in_this_run(w.name)
    }
    plan = copy_plan(mine, workers, base)
    missing, mismatched = plan.missing, plan.mismatched
    host.log(f"image: {describe(mine, base, knobs.image_repo, tag)}")
    for name, report in workers.items():
        host.log(f"image on {name}: {describe(report, base, knobs.image_repo, tag)}")

# Every operation below exists on every host (acting only where its condition holds), so all
# hosts share one sequence: the head pulls, saves and serves, the workers copy, the head stops
# serving, then every node builds the patched image.
on_head(
    is_head,
    base_image_pulled,
    name="Pull the pinned base image on the head",
    image_repo=knobs.image_repo,
    base_image=base,
    tag=tag,
    record=paths(settings).pulled_images,
)
served = on_head(
    is_head,
    base_image_served,
    name="Serve the base image to the workers over the fabric",
    image_repo=knobs.image_repo,
    base_image=base,
    fetcher=hostpkg.invocation(knobs.install_dir),
    directory=knobs.image_transfer_dir,
    listen=settings.listen_on(knobs.image_copy_port),
    workers=missing,
    mismatched=mismatched,
    bind_device=settings.helper_device,
)
on_workers(
    is_head,
    base_image_loaded,
    name="Copy the base image from the head over the fabric",
    image_repo=knobs.image_repo,
    base_image=base,
    tag=tag,
    directory=knobs.image_transfer_dir,
    source=f"http://{settings.dial(settings.head)}:{knobs.image_copy_port}",
    head=settings.head.name,
    fetcher=hostpkg.invocation(knobs.install_dir),
    source_absent=""
    if in_this_run(settings.head.name)
    else f"the head ({settings.head.name}) serves it to the workers and is not in this run: run "
    "`pyinfra inventory.py deploy.py` with the head (no --limit)",
)
on_head(
    is_head,
    base_image_unserved,
    name="Stop serving the base image",
    directory=knobs.image_transfer_dir,
    served=bool(missing),
    _if=served.did_change,
)
if settings.stack.patched:  # the stack is the same on every host: so is this operation
    patched_image_built(
        name="Build the patched serving image",
        image_repo=knobs.image_repo,
        base_image=base,
        tag=tag,
        build_dir=f"{knobs.install_dir}/image-build",
        skip_patches=list(knobs.image_skip_patches),
    )
