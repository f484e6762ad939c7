"""Four fake Sparks in fabric_layout "ports": a ring (planned; the deploy refuses the default
stack on it)."""

from tests.plan.fakehosts import host

RING = {"fabric_layout": "ports"}


def ring_host(name: str) -> tuple[str, dict]:
    lan = f"192.168.1.{10 + 'abcd'.index(name[-1])}"  # spark-a .10, ..., spark-d .13
    address, data = host(name, "192.168.100.10", lan_address=lan, **RING)
    return address, {
        k: v for k, v in data.items() if k not in ("fabric_address", "fabric_interface")
    }


head = [ring_host("spark-a")]
worker = [ring_host(f"spark-{n}") for n in "bcd"]
