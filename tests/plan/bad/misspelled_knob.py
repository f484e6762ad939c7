from tests.plan.fakehosts import host

head = [host("spark-a", "192.168.100.10")]
worker = [host("spark-b", "192.168.100.11", profil="guard")]
