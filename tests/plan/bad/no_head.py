from tests.plan.fakehosts import host

worker = [host("spark-b", "192.168.100.11")]
