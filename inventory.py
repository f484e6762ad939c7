"""Your Sparks. Fill in the three REQUIRED keys of each host; the rest is optional and commented.

One host in `head` (rank 0), the others in `worker` (ranks 1..N-1, in this order). Every other
knob is in group_data/all.py; the per-host keys: docs/operating.md "Inventory". To try sparkrig
without Sparks, use the lab: lab/inventory.py.

fabric_interface: one QSFP cable shows up as TWO netdevs, both Up (the port is two PCIe x4
functions, each with its own RDMA device). `ibdev2netdev` on a Spark cabled at port 1 prints:

    rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)
    roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)

Use the first, on PCIe domain 0: `enp1s0f1np1` (`enp1s0f0np0` when the cable is in port 0), the
same function on every Spark. On a pair sparkrig serves over both functions (fabric_layout
"auto"): `fabric_address` is the first's, and the twin (`enP2p1s0f1np1`, `roceP2p1s0f1`) gets the
same host number on the buddy subnet (192.168.100.10/24 -> 192.168.101.10/24), so keep that /24
free. One function gives about 12 GB/s all-reduce, both about 21 (docs/rings.md); fabric_layout =
"single" holds a pair to the first.

Four Sparks as two pairs behind one endpoint: give every host `"pair": "pair_a"` (or
"pair_b"), every head its `lan_address`, and add the groups `pair_a = [...]`, `pair_b = [...]`
(docs/pairs.md); a release then rolls one pair at a time: `python3 -m sparkrig roll inventory.py`.

Host keys are pinned (as lab/inventory.py does): pyinfra connects only to a host whose key is in
.sparkrig/known_hosts, never accepting a new one on first use. Fill it once, checking each
fingerprint at the Spark's console (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` there):

    mkdir -p .sparkrig
    ssh-keyscan -t ed25519 spark-a.local spark-b.local >> .sparkrig/known_hosts
    ssh-keygen -lf .sparkrig/known_hosts
"""

KNOWN_HOSTS = {  # strict host-key checking against a known_hosts file of this checkout's own
    "ssh_known_hosts_file": ".sparkrig/known_hosts",
    "ssh_strict_host_key_checking": "yes",
}

head = [
    (
        "spark-a",  # the name the run's output uses
        {
            "ssh_hostname": "spark-a.local",  # REQUIRED: this Spark's LAN address (not the fabric)
            # "ssh_user": "nvidia",  # the sudo-capable DGX OS user; default: your SSH config's
            # "ssh_key": "~/.ssh/id_ed25519",  # default: your SSH agent and ~/.ssh keys
            "fabric_interface": "enp1s0f1np1",  # REQUIRED: the cabled function (docstring above)
            "fabric_address": "192.168.100.10/24",  # REQUIRED: this rank's fabric IPv4/prefix
            # "roce_device": "rocep1s0f1",  # its RDMA device; detected from the GID table
            # Weights download lanes, one per uplink, each with an IPv4 address and a gateway;
            # absent: one lane over the default route. Wi-Fi (wlP9s9) only once it is configured.
            # "uplink_interfaces": ["enP7s7", "wlP9s9"],
            # "api_url": "https://spark-a.local:8000",  # how the bench reaches the API (default)
            **KNOWN_HOSTS,
        },
    ),
]

worker = [
    (
        "spark-b",
        {
            "ssh_hostname": "spark-b.local",  # REQUIRED
            # "ssh_user": "nvidia",
            # "ssh_key": "~/.ssh/id_ed25519",
            "fabric_interface": "enp1s0f1np1",  # REQUIRED
            "fabric_address": "192.168.100.11/24",  # REQUIRED: the head's subnet
            **KNOWN_HOSTS,
        },
    ),
]
