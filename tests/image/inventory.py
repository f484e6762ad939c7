"""Two fake Sparks whose canned state tests/image sets in fakeimage.STATE before the run."""

from tests.image.fakeimage import STATE
from tests.plan.fakehosts import host

head = [host("spark-a", "192.168.100.10", responses=STATE.get("spark-a"))]
worker = [host("spark-b", "192.168.100.11", responses=STATE.get("spark-b"))]
