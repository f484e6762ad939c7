"""Four fake Sparks (one head, three workers) whose canned state tests set in fakehosts.STATE."""

from tests.plan.fakehosts import STATE, host

head = [host("spark-a", "192.168.100.10", responses=STATE.get("spark-a"))]
worker = [
    host(f"spark-{n}", f"192.168.100.{11 + i}", responses=STATE.get(f"spark-{n}"))
    for i, n in enumerate("bcd")
]
