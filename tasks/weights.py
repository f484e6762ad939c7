"""Phase 4, weights: where the checkpoint (and the drafter, when the profile needs it) lands.

The verified, split-uplink fetch and the fabric copy to every worker fill this phase in."""

from pyinfra import host
from pyinfra.operations import files

from sparkrig.settings import current

s = current()
k = s.knobs

for directory in host.loop([k.weights_dir, k.cache_dir]):
    files.directory(
        name="Create the weights and cache directories",
        path=directory,
        user="root",
        group="root",
        mode="755",
    )
