"""A ring of four whose spark-c names the same netdev for both ports (refused by the plan)."""

from tests.plan.rings.ring_four import ring_host

same = {"netdev": "enp1s0f0np0"}
head = [ring_host("spark-a")]
name, data = ring_host("spark-c")
worker = [
    ring_host("spark-b"),
    (name, {**data, "fabric_ports": {0: same, 1: same}}),
    ring_host("spark-d"),
]
