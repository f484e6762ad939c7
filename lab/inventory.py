"""pyinfra inventory for the running qemu lab: `pyinfra lab/inventory.py deploy.py`.

Reads .lab/state.json (written by `python3 -m lab up`). Same host data keys as a real inventory
(fabric_interface, fabric_address, roce_device, uplink_interfaces, ssh_*; with `lab up --fabric
ports`: fabric_layout "ports", and on three guests and more lan_address), plus the lab's knob
overrides as host data so they beat group_data/*.py (pyinfra lets group_data files override inline
group data, but host data wins over both; `--data k=v` still wins over everything).
Module-level lists are pyinfra groups: keep helpers private (leading underscore).

Stacks: a lab built with a stand-in per stack (state "stack_pins", written by `lab up`) gives
every stack its stand-in image and fake Hub repos as `stack_pins` and sets no top-level
base_image/model_*/drafter_*, so `--data stack=entrpi-exl3` alone switches the pair (a top-level
knob would override every stack's pin). A lab from before that keeps today's top-level pins.
Lab-only override, e.g. for a stack whose engine never becomes ready (the rollback test):
`--data stack=entrpi-exl3 --data base_image=<state "image_never_ready">`.

Pairs (`lab up --pairs P`, state "pairs"): every host names its pair (host data ``pair``), every
head gets its LAN address (``lan_address``: its management address, where the other heads' fronts
reach its API) and its own loopback forward as ``api_url``, and each pair is a group of its own
named after it (``pair_a``, ``pair_b``, ...: `pyinfra lab/inventory.py deploy.py --limit pair_b`).
Without pairs nothing of that is said: the inventory is today's.
"""

import json as _json
from pathlib import Path as _Path

_STATE_FILE = _Path(__file__).resolve().parent.parent / ".lab" / "state.json"
if not _STATE_FILE.exists():
    raise RuntimeError("lab is not up: run python3 -m lab up")
_state = _json.loads(_STATE_FILE.read_text())

# knobs pointed at the lab's stand-ins and sized for 2 GiB TCG guests without GPUs
_knobs = {
    "hub_endpoint": _state["hub_endpoint"],
    "container_gpu_args": [],
    "container_memory": "1g",
    "min_disk_free_gib": 1,
    "memfree_min_gib": 0.2,
    # the fake Hub's drafters are test data, not the CC BY-NC-ND DFlash2; accepting here lets a
    # stack whose one profile loads a drafter (entrpi-exl3, sfxnz-v13) switch with --data stack=
    "drafter_license_accepted": True,
    "nccl_smoke": False,  # the stand-in image has no torch/NCCL to smoke-test
    "image_skip_patches": ["sm121-topk"],  # ... and no vLLM for the SM121 top-k patch
    # the guests' RoCE device is Soft-RoCE, made by their lab-rxe unit (lab/build-image.sh)
    "roce_device_restore": ["systemctl restart lab-rxe"],
    # lab-sized timings (the stand-in boots in seconds); the watchdog is on, as shipped
    "pair_grace_s": 150,  # a rank's wait for its peers at start: the head's start-gate bound
    "watchdog_grace_s": 180,  # the stand-in boots in about a minute under TCG
    "watchdog_interval_s": 5,
    "watchdog_fails": 3,
    "watchdog_stall_s": 60,  # tests/lab STALL_S: the wedge is timed against it
    "ready_timeout_s": 180,  # <= watchdog_grace_s (config/rules.py); the stand-in boots in ~1 min
    # the soak gate lab-sized: past the stand-in's wedge and one watchdog_stall_s, not 30 minutes
    "soak_minutes": 2,
    "bench_gate_runs": 1,  # one short bench per release change: the stand-in's spread is its own
}
if "api_forward_port" not in _state:  # a lab from before the API forward: no bench reaches it
    _knobs["bench_gate"] = False
# model_repo / model_revision / drafter_* etc.: whatever generated the Hub stand-in's repos put in
# <hub_root>/knobs.json, copied to state["knobs"] by `lab up`
if "stack_pins" in _state:  # {stack: {base_image, model_*, drafter_*}}, `lab up` from stacks on
    _knobs["stack_pins"] = _state["stack_pins"]
    _pinned = {key for pins in _state["stack_pins"].values() for key in pins}
    _knobs.update({k: v for k, v in _state.get("knobs", {}).items() if k not in _pinned})
else:
    _knobs["base_image"] = _state["image"]
    _knobs.update(_state.get("knobs", {}))


def _host(h: dict) -> tuple:
    data = {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": h["ssh_port"],
        "ssh_user": _state["ssh_user"],
        "ssh_key": _state["ssh_key"],
        "ssh_known_hosts_file": _state["known_hosts"],
        "ssh_strict_host_key_checking": "yes",
        "ssh_connect_retries": 2,
        "fabric_interface": h["fabric_interface"],
        "fabric_address": h["fabric_address"],
        "roce_device": h["roce_device"],
        "uplink_interfaces": list(h["uplink_interfaces"]),
    }
    if h.get("fabric_layout", "single") == "single":  # one NIC on a switch: said, not the default
        data["fabric_layout"] = "single"
    if h.get("fabric_layout", "single") == "ports":  # `lab up --fabric ports` (lab/fabric.py)
        # every address derived from fabric_cidr, the RDMA devices from DGX OS's names (the
        # guests' Soft-RoCE devices carry them); a pair names its port's primary netdev, a ring
        # names none (both ports) and meets at the head's LAN address
        del data["fabric_address"], data["roce_device"]
        data["fabric_layout"] = "ports"
        if h.get("lab_hosts", 2) > 2:
            del data["fabric_interface"]
            data["lan_address"] = h["mgmt_address"]
    if h["role"] == "head" and "api_forward_port" in _state:  # the control side's way to the API
        port = _state.get("api_forward_ports", {}).get(h["name"], _state["api_forward_port"])
        data["api_url"] = f"https://127.0.0.1:{port}"
    if _state.get("pairs"):  # two pairs and more behind one endpoint (issue 52)
        data["pair"] = h["pair"]
        if h["role"] == "head":  # the other heads' fronts reach this head's API here
            data["lan_address"] = h["mgmt_address"]
    data.update(_knobs)
    if h["role"] == "head":  # clients on the uplinks dial the head by its uplink addresses
        data["api_tls_names"] = sorted(h.get("uplink_addresses", {}).values())
    return (h["name"], data)


_hosts = [_host(h) for h in _state["hosts"]]
head = [hd for hd, h in zip(_hosts, _state["hosts"], strict=True) if h["role"] == "head"]
worker = [hd for hd, h in zip(_hosts, _state["hosts"], strict=True) if h["role"] == "worker"]
if _state.get("pairs"):  # one group per pair, named after it (a module-level list is a group)
    for _pair in dict.fromkeys(h["pair"] for h in _state["hosts"]):
        globals()[_pair] = [hd for hd in _hosts if hd[1]["pair"] == _pair]
