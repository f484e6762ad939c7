"""Four fake Sparks in fabric_layout "ports": a ring (planned, refused by the deploy for now)."""

from tests.plan.fakehosts import host

RING = {"fabric_layout": "ports"}


def ring_host(name: str) -> tuple[str, dict]:
    address, data = host(name, "192.168.100.10", **RING)
    return address, {
        k: v for k, v in data.items() if k not in ("fabric_address", "fabric_interface")
    }


head = [ring_host("spark-a")]
worker = [ring_host(f"spark-{n}") for n in "bcd"]
