"""Four bare fake Sparks: one head, three workers."""

from tests.plan.fakehosts import host

head = [host("spark-a", "192.168.100.10")]
worker = [host(f"spark-{n}", f"192.168.100.{11 + i}") for i, n in enumerate("bcd")]
