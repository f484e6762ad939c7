"""Two fake Sparks whose canned state the test sets in fakehosts.STATE before the run."""

from tests.plan.fakehosts import STATE, host

head = [
    host(
        "spark-a",
        "192.168.100.10",
        responses=STATE.get("spark-a"),
        uplink_interfaces=["enP7s7", "wlP9s9"],
    )
]
worker = [host("spark-b", "192.168.100.11", responses=STATE.get("spark-b"))]
