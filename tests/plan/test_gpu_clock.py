"""The opt-in GPU clock cap (knob gpu_clock_max_mhz) through the real CLI on strict @fake hosts:
a oneshot unit ordered before the rank unit, applied now and enabled for every boot, restarting
no rank; off (the default), nothing of it is sent."""

from __future__ import annotations

from tests.plan import fakehosts
from tests.plan.test_plan import HEAD, STOP, WORKER, acting, apply, converge_state, position

UNIT = "/etc/systemd/system/sparkrig-gpu-clock.service"


def test_a_clock_cap_is_a_boot_unit_before_the_rank_applied_now_without_a_restart(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--data", "gpu_clock_max_mhz=2400")
    assert r.exit_code == 0, r.output
    for name, rank in ((HEAD, "sparkrig-head"), (WORKER, "sparkrig-worker")):
        unit = r.uploads[name][UNIT].decode()
        assert "ExecStart=/usr/bin/nvidia-smi -lgc 0,2400\n" in unit
        assert f"Before={rank}.service\n" in unit and "WantedBy=multi-user.target" in unit
        assert "ExecStop=/usr/bin/nvidia-smi -rgc\n" in unit  # stopping it resets the clocks
        cmds = r.commands[name]
        reload_at = cmds.index("systemctl daemon-reload")
        assert reload_at < cmds.index("systemctl start sparkrig-gpu-clock.service")
        assert "systemctl enable sparkrig-gpu-clock.service" in cmds
        assert not [c for c in cmds if c.startswith("systemctl stop sparkrig-")], cmds
    assert STOP not in r.changed_ops.get(HEAD, [])
    assert position(r, "Install the GPU clock lock unit") < position(r, "Start the head rank")


def test_switched_off_the_lock_is_stopped_and_its_unit_removed(monkeypatch):
    converge_state()
    for short in ("spark-a", "spark-b"):
        fakehosts.inject(short, {
            fakehosts.owned_of(UNIT): "file 644 root root " + "0" * 64,
            fakehosts.unit_fact("sparkrig-gpu-clock", "SubState"):
                ["Id=sparkrig-gpu-clock.service", "SubState=exited"],
        })  # fmt: skip
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        assert "systemctl stop sparkrig-gpu-clock.service" in r.commands[name]
        assert f"rm -f {UNIT}" in r.commands[name]


def test_off_by_default_nothing_of_it_is_sent(monkeypatch):
    converge_state()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert not acting(r, "gpu-clock"), acting(r, "gpu-clock")
