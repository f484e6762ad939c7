"""Four fake Sparks in a ring as the cabling rule says, with their fabric facts
(tests/plan/rings/ringfakes.py)."""

from tests.plan.rings.ringfakes import ring_host

head = [ring_host("spark-a", 4, 0)]
worker = [ring_host(f"spark-{n}", 4, r) for r, n in enumerate("bcd", start=1)]
