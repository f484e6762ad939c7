"""Three fake Sparks in a triangle as the cabling rule says, with their fabric facts
(tests/plan/rings/ringfakes.py)."""

from tests.plan.rings.ringfakes import ring_host

head = [ring_host("spark-a", 3, 0)]
worker = [ring_host(f"spark-{n}", 3, r) for r, n in enumerate("bc", start=1)]
