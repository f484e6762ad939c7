"""Four fake Sparks as two pairs behind one endpoint: pair_a (spark-a, spark-b) and pair_b
(spark-c, spark-d), each its own subnet; canned state from fakehosts.STATE."""

from tests.plan.fakehosts import STATE, host


def _host(name: str, ip: str, pair: str, lan: str) -> tuple[str, dict]:
    return host(name, ip, responses=STATE.get(name), pair=pair, lan_address=lan)


head = [
    _host("spark-a", "192.168.100.10", "pair_a", "172.30.1.11"),
    _host("spark-c", "192.168.110.10", "pair_b", "172.30.1.13"),
]
worker = [
    _host("spark-b", "192.168.100.11", "pair_a", "172.30.1.12"),
    _host("spark-d", "192.168.110.11", "pair_b", "172.30.1.14"),
]
pair_a = [head[0], worker[0]]
pair_b = [head[1], worker[1]]
