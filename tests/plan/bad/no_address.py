from tests.plan.fakehosts import host

head = [host("spark-a", "192.168.100.10")]
worker = [
    (
        "@fake/spark-b",
        {"fabric_interface": "enp1s0f1np1", "fabric_layout": "single", "fake_delay": 0},
    )
]
