"""The fake pair in fabric_layout "ports": both functions of the cable in port 1 of each rank;
each host a bare node with the fabric facts of tests/plan/rings/pairfakes.py (a test puts its
own ahead of them in fakehosts.STATE)."""

from tests.plan.rings.pairfakes import pair_host

head = [pair_host("spark-a", 0)]
worker = [pair_host("spark-b", 1)]
