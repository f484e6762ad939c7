"""A fake pair of today's inventory form: fabric_interface, fabric_address and roce_device
per host, no fabric_layout (the default, "auto"): the cable in port 1 of both ranks."""

from tests.plan.rings.pairfakes import today_host

head = [today_host("spark-a", 0)]
worker = [today_host("spark-b", 1)]
