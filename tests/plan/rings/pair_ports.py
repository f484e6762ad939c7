"""The fake pair in fabric_layout "ports": valid, planned, not applied by the deploy yet."""

from tests.plan.fakehosts import host


def pair_host(name: str) -> tuple[str, dict]:
    address, data = host(name, "192.168.100.10", fabric_layout="ports")
    return address, {k: v for k, v in data.items() if k != "fabric_address"}


head = [pair_host("spark-a")]
worker = [pair_host("spark-b")]
