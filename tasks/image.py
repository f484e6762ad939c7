"""Phase 5, image: the vLLM image pinned by digest, the same content on every node."""

from sparkrig.operations import image_present
from sparkrig.settings import current

s = current()

image_present(name="Pull the pinned vLLM image", ref=s.knobs.base_image)
