"""Three fake Sparks: a head and two workers."""

from tests.plan.fakehosts import host

head = [host("spark-a", "192.168.100.10")]
worker = [host("spark-b", "192.168.100.11"), host("spark-c", "192.168.100.12")]
