from tests.plan.fakehosts import host

head = [host("spark-a", "192.168.100.10"), host("spark-c", "192.168.100.12")]
worker = [host("spark-b", "192.168.100.11")]
