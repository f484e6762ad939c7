"""Your Sparks. Edit this file: one host in `head` (rank 0), the others in `worker` (ranks
1..N-1, in this order). Per-host keys are documented in README.md; every other knob is in
group_data/all.py. To try sparkrig without Sparks, use the lab: lab/inventory.py."""

head = [
    (
        "spark-a",
        {
            "ssh_hostname": "spark-a.local",
            "fabric_interface": "enp1s0f1np1",  # the CX7 function that is cabled (ibdev2netdev)
            "fabric_address": "192.168.100.10/24",
            # "roce_device": "rocep1s0f1",  # optional: detected from the GID table when absent
            "uplink_interfaces": ["enP7s7", "wlP9s9"],  # weights download lanes, one per uplink
            # "api_url": "http://spark-a.local:8000",  # optional: how the bench reaches the API
        },
    ),
]

worker = [
    (
        "spark-b",
        {
            "ssh_hostname": "spark-b.local",
            "fabric_interface": "enp1s0f1np1",
            "fabric_address": "192.168.100.11/24",
        },
    ),
]
