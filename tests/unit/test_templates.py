"""Every file the deploy owns, rendered for 2 and 4 nodes, against reviewed golden copies.

After an intended change, regenerate them with `python3 scripts/update-golden.py`, review the
diff and commit it; the test itself only ever compares."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkrig import firewall, front
from sparkrig.baseline import grub_text
from sparkrig.config.inventory import build
from sparkrig.config.model import Settings
from sparkrig.fabric import env_context
from sparkrig.helperunits import pair_unit_context
from sparkrig.render import base_context, render
from sparkrig.serving import rank_unit_context, weights_id
from tests.unit.conftest import cluster

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def owned_files(s: Settings) -> dict[str, str]:
    k = s.knobs
    return {
        "90-sparkrig.conf": render(
            "sysctl.conf.j2", swappiness=k.swappiness, min_free_kbytes=k.min_free_kbytes
        ),
        "60-sparkrig-fabric.yaml": render(
            "netplan-fabric.yaml.j2",
            **base_context(s),
            address=s.me.fabric_address.with_prefixlen,
            mtu=k.fabric_mtu,
        ),
        "rank.env": render("rank.env.j2", **env_context(s), hca="rocep1s0f1", gid_index="3"),
        f"{s.unit_name}.service": render(
            "sparkrig-rank.service.j2", **rank_unit_context(s, s.image_ref, weights_id(s))
        ),
        "sparkrig-pair.service": render("sparkrig-pair.service.j2", **pair_unit_context(s)),
        "90-sparkrig-kho.cfg": grub_text(),  # written where the kernel has KHO (kho_off)
        # the head's API front (sparkrig/front.py); workers have none
        **(
            {
                "sparkrig-api.conf": front.site_text(s),
                "nginx-restart.conf": front.restart_dropin_text(),
            }
            if s.me.is_head
            else {}
        ),
        "firewall.nft": firewall.ruleset(s),
        "sparkrig-firewall.service": firewall.unit(s),
        # beside the rank and its listening helpers (the same text for each)
        "sparkrig-firewall-requires.conf": firewall.requires_text(),
    }


def rendered(nodes: int) -> dict[Path, str]:
    """Every owned file of an n-node cluster, keyed by its golden path."""
    settings = build(
        cluster(nodes, min_free_kbytes=1048576, nccl_env={"NCCL_DEBUG_SUBSYS": "INIT"})
    )
    return {
        GOLDEN / f"{nodes}nodes" / name / filename: text
        for name, s in settings.items()
        for filename, text in owned_files(s).items()
    }


@pytest.mark.parametrize("nodes", [2, 4])
def test_rendered_files_match_golden(nodes):
    files = rendered(nodes)
    on_disk = {p for p in (GOLDEN / f"{nodes}nodes").rglob("*") if p.is_file()}
    assert on_disk == set(files), "golden files differ in number; scripts/update-golden.py"
    for path, text in files.items():
        assert text == path.read_text(), f"{path} differs; scripts/update-golden.py, then review"


def test_worker_unit_is_headless_and_head_unit_waits_for_workers():
    settings = build(cluster(4))
    head = owned_files(settings["spark-0"])["sparkrig-head.service"]
    worker = owned_files(settings["spark-3"])["sparkrig-worker.service"]
    assert "--headless" in worker and "--headless" not in head
    assert "--node-rank 3" in worker and "--node-rank 0" in head
    assert "sparkhost pair wait --peers 192.168.100.11,192.168.100.12,192.168.100.13" in head
    assert "sparkhost pair wait" not in worker
    for unit in (head, worker):
        assert "--block-size 2304" in unit and "--language-model-only" in unit
        assert "--device /dev/infiniband:/dev/infiniband" in unit
        assert "--ulimit memlock=-1:-1" in unit
        assert "/lib/sparkhost prep --env /etc/sparkrig/rank.env" in unit
        assert "Restart=no" in unit


def test_json_arguments_are_quoted_for_systemd():
    s = build(cluster(2))["spark-0"]
    unit = owned_files(s)["sparkrig-head.service"]
    assert """--speculative-config '{"method":"mtp","num_speculative_tokens":4}'""" in unit


def test_the_head_gives_vllm_its_key_by_env_file_and_the_watchdog_reads_it_from_its_file():
    from sparkrig.front import api_key_file
    from sparkrig.helperunits import watchdog_unit_context
    from sparkrig.serving import smoke_run_args

    for auth in (True, False):
        settings = build(cluster(2, api_auth=auth, watchdog=True))
        head, worker = settings["spark-0"], settings["spark-1"]
        unit = owned_files(head)["sparkrig-head.service"]
        assert ("--env-file /etc/sparkrig/api-key.env" in unit) is auth
        assert "api-key" not in owned_files(worker)["sparkrig-worker.service"]
        assert "api-key" not in " ".join(smoke_run_args(head, "img"))  # the smoke test: no API
        watchdog = render("sparkrig-watchdog.service.j2", **watchdog_unit_context(head))
        probe = "/usr/bin/python3 /opt/sparkrig/lib/sparkhost gate probe "
        assert probe in watchdog
        assert ("--api-key-file /etc/sparkrig/api-key'" in watchdog) is auth
        assert api_key_file(head) == ("/etc/sparkrig/api-key" if auth else None)
        assert api_key_file(worker) is None


def test_every_helper_unit_bounds_its_descriptors_and_tasks():
    """A stranger's connections end at the servers' cap (sparkhost.helperhttp); the units bound
    what is left (LimitNOFILE, TasksMax)."""
    from sparkrig.helperunits import (
        agent_unit_context,
        supervisor_unit_context,
        watchdog_unit_context,
    )

    settings = build(cluster(2, watchdog=True))
    head, worker = settings["spark-0"], settings["spark-1"]
    units = {
        "pair": owned_files(head)["sparkrig-pair.service"],
        "agent": render("sparkrig-agent.service.j2", **agent_unit_context(worker)),
        "supervisor": render("sparkrig-supervisor.service.j2", **supervisor_unit_context(head)),
        "watchdog": render("sparkrig-watchdog.service.j2", **watchdog_unit_context(head)),
    }
    for name, text in units.items():
        service = text.split("[Service]", 1)[1].split("\n[", 1)[0]
        assert "\nLimitNOFILE=4096\n" in service and "\nTasksMax=256\n" in service, name
