"""sparkrig.baseline: the host baseline's script (run by a real shell here), its typed parse (a
bad line fails its host), the package holds, the rank table, the catalogue and drift."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig.baseline import (
    Baseline,
    BaselineReport,
    drift,
    held_packages,
    kernel_flavour,
    known_bad,
    mismatch,
    parse_baseline,
)
from sparkrig.config.inventory import build
from sparkrig.factlines import END
from sparkrig.release import Release, parse_record, record_text
from sparkrig.status import parse_rank_state
from tests.plan.fakehosts import KHO_DEFAULT_ON, SPARK_KERNEL, baseline_report
from tests.unit.conftest import cluster

# /proc/driver/nvidia/version's first line as the open kernel modules print it (the format:
# https://github.com/nix-community/nixGL/issues/186, aarch64: .../issues/139)
OPEN_580 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.173.02  Release Build  "
    "(dvs-builder@U22-I3-AF03-09-1)  Thu Sep 18 20:36:04 UTC 2025"
)
PROPRIETARY_535 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024"
)


def test_the_script_reads_what_the_kernel_says():
    fact = Baseline()
    command = fact.command(fabric_interface="lo")
    done = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True
    )
    b = fact.process(done.stdout.splitlines())
    assert b.kernel == platform.release()
    assert b.cmdline == Path("/proc/cmdline").read_text().strip()
    assert b.nic_fw == ""  # the loopback NIC has no RDMA device


def lines(*extra: str, driver: str = "") -> list[str]:
    out = ["kernel=6.17.0-1032-nvidia", "cmdline=ro quiet"]
    out += [f"driver_proc={driver}"] if driver else []
    return [*out, *extra, END]


def test_the_driver_comes_from_the_module_or_the_proc_file():
    assert parse_baseline(lines(driver=OPEN_580)).driver == "580.173.02"
    assert parse_baseline(lines(driver=OPEN_580)).driver_open
    old = parse_baseline(lines(driver=PROPRIETARY_535))
    assert old.driver == "535.183.01" and not old.driver_open
    assert parse_baseline(lines("driver_module=580.95.05")).driver == "580.95.05"
    assert parse_baseline(lines()).driver == ""  # no NVIDIA module: the lab's guests


def test_a_real_drivers_files_parse_as_the_driver_says():
    """The files a real 580-branch driver writes (tests/unit/data/nvidia-580.159.04-h200), as the
    baseline script reads them: the first line of each."""
    real = Path(__file__).parent / "data" / "nvidia-580.159.04-h200"
    proc = (real / "proc-driver-nvidia-version.txt").read_text().splitlines()[0]
    module = (real / "sys-module-nvidia-version.txt").read_text().strip()
    said = (real / "nvidia-smi-query.txt").read_text().split(",")[0]
    from_proc = parse_baseline(lines(driver=proc))
    assert from_proc.driver == said == "580.159.04" and from_proc.driver_open
    assert parse_baseline(lines(f"driver_module={module}")).driver == said


@pytest.mark.parametrize(
    "bad",
    [
        lines(driver="NVRM version: something else"),
        lines("driver_module=580.x"),
        lines("pkg=ii linux-image-6.17.0-1032-nvidia 6.17.0-1032.32"),  # not '|'-separated
        lines("pkg=i|linux-image|1"),  # the status abbreviation is three letters
        ["kernel=6.17.0-1032-nvidia", "cmdline=ro"],  # cut: no end marker
        ["cmdline=ro", END],  # no kernel release
    ],
)
def test_a_bad_line_fails_its_host(bad):
    with pytest.raises(FactProcessError):
        parse_baseline(bad)


def test_a_spark_report_parses_typed():
    b = parse_baseline(baseline_report(held=True))
    assert b.kernel == SPARK_KERNEL and b.driver == "580.95.05" and b.nic_fw == "28.45.4028"
    assert b.bios == "NVIDIA 5.36_0ACUM018 09/12/2025" and b.board == "NVIDIA DGX Spark"
    assert b.docker == "5:28.3.3-1~ubuntu.24.04~noble" and b.toolkit == "1.17.8-1"
    assert "docker.io" not in {p.name for p in b.packages}  # known to dpkg, not installed
    assert all(p.held for p in b.packages if p.name.startswith("linux-image"))


@pytest.mark.parametrize(
    ("config", "cmdline", "active"),
    [
        (KHO_DEFAULT_ON, "ro quiet", True),
        (KHO_DEFAULT_ON, "ro quiet kho=off", False),
        (KHO_DEFAULT_ON, "kho=off ro kho=on", True),  # the last one wins
        (("CONFIG_KEXEC_HANDOVER=y",), "ro", False),
        (("CONFIG_KEXEC_HANDOVER=y",), "ro kho=1", True),
        ((), "ro kho=on", False),  # not built in: nothing to turn on
    ],
)
def test_kexec_handover_is_on_when_built_in_and_enabled(config, cmdline, active):
    b = parse_baseline(["kernel=7.0.0-1019-nvidia", f"cmdline={cmdline}", *config, END])
    assert b.kho_active is active


def test_the_hold_covers_the_running_kernel_its_metapackages_and_the_driver_branch():
    b = parse_baseline(baseline_report())
    held = {p.name for p in held_packages(b)}
    assert held == {
        f"linux-image-{SPARK_KERNEL}",
        f"linux-modules-{SPARK_KERNEL}",
        f"linux-headers-{SPARK_KERNEL}",
        "linux-image-nvidia-hwe-24.04",
        "linux-nvidia-hwe-24.04",
        f"linux-modules-nvidia-580-open-{SPARK_KERNEL}",
        "nvidia-driver-580-open",
        "libnvidia-compute-580",
    }


def test_on_debian_the_hold_covers_the_running_image_and_its_metapackage():
    b = parse_baseline(
        [
            "kernel=6.12.48+deb13-amd64",
            "cmdline=ro",
            "pkg=ii |linux-image-6.12.48+deb13-amd64|6.12.48-1",
            "pkg=ii |linux-image-6.12.41+deb13-amd64|6.12.41-1",  # an older one, not running
            "pkg=ii |linux-image-amd64|6.12.48-1",
            "pkg=ii |linux-base|4.12",
            END,
        ]
    )
    assert kernel_flavour(b.kernel) == "amd64"
    assert kernel_flavour("7.0.0-1019-nvidia-64k") == "nvidia-64k"
    assert [p.name for p in held_packages(b)] == [
        "linux-image-6.12.48+deb13-amd64",
        "linux-image-amd64",
    ]


def test_ranks_that_differ_get_a_table_naming_what_differs():
    a, b = parse_baseline(baseline_report()), parse_baseline(baseline_report(driver="580.173.02"))
    assert mismatch({"x": a, "y": a}, ["x", "y"]) == ""
    table = mismatch({"x": a, "y": b}, ["x", "y"])
    assert table.startswith("the ranks differ on driver ")
    rows = [r.split() for r in table.splitlines()[1:]]
    assert rows[0] == ["rank", "host", "kernel", "driver", "nic_fw"]
    assert rows[1] == ["0", "x", SPARK_KERNEL, "580.95.05", "28.45.4028"]
    assert rows[2] == ["1", "y", SPARK_KERNEL, "580.173.02", "28.45.4028"]
    # the fields outside the must-match three never make a table
    other = BaselineReport(**{**a.__dict__, "bios": "other", "cmdline": "other"})
    assert mismatch({"x": a, "y": other}, ["x", "y"]) == ""


def test_the_catalogue_refuses_kho_on_and_names_its_source():
    s = build(cluster(2))["spark-0"]
    on = parse_baseline(baseline_report(kernel="7.0.0-1019-nvidia", kho=KHO_DEFAULT_ON))
    (why,) = known_bad(s, on)
    assert "kexec handover is on" in why
    assert "https://github.com/MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks/issues/14" in why
    off = parse_baseline(
        baseline_report(kernel="7.0.0-1019-nvidia", kho=KHO_DEFAULT_ON, cmdline="ro kho=off")
    )
    assert known_bad(s, off) == [] and known_bad(s, parse_baseline(baseline_report())) == []


def test_a_catalogue_entry_matches_only_when_every_condition_holds():
    entry = {
        "base_image": r"^registry\.example/vllm@",
        "driver_below": "590.48",
        "reason": "built for driver 590.48 or later",
        "source": "https://github.com/eugr/spark-vllm-docker/issues/266",
    }
    s = build(cluster(2, known_bad_baselines=[entry]))["spark-0"]  # cluster's image matches
    assert known_bad(s, parse_baseline(baseline_report(driver="580.159.03")))
    assert not known_bad(s, parse_baseline(baseline_report(driver="590.48.01")))
    other = build(cluster(2, known_bad_baselines=[{**entry, "base_image": "^other/"}]))["spark-0"]
    assert not known_bad(other, parse_baseline(baseline_report(driver="580.159.03")))


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"reason": "r", "source": "https://x.example/1"}, "names no condition"),
        ({"kernel": "(", "reason": "r", "source": "https://x.example/1"}, "not a regular"),
        ({"kernel": "^7", "reason": "r", "source": "a thread"}, "source"),
        ({"kernel": "^7", "reason": "r", "source": "https://x", "why": "x"}, "why"),
    ],
)
def test_a_bad_catalogue_entry_stops_the_run_before_any_host(entry, says):
    from pyinfra.api.exceptions import DeployError

    with pytest.raises(DeployError, match=says):
        build(cluster(2, known_bad_baselines=[entry]))


def test_drift_names_each_field_that_moved():
    was = parse_baseline(baseline_report()).fields()
    now = parse_baseline(baseline_report(kernel="7.0.0-1019-nvidia", driver="580.173.02"))
    moved = drift(was, now)
    assert f"kernel {SPARK_KERNEL} -> 7.0.0-1019-nvidia" in moved
    assert "driver 580.95.05 -> 580.173.02" in moved
    assert [m.split()[0] for m in moved] == ["kernel", "cmdline", "driver"]
    assert drift(was, parse_baseline(baseline_report(held=True))) == []  # a hold is no drift
    assert drift({}, now) == []  # nothing recorded: nothing to compare


def test_the_record_keeps_the_baseline_and_reads_records_without_one():
    fields = tuple(sorted(parse_baseline(baseline_report()).fields().items()))
    plain = Release("i:t", "b:t", "a" * 40, "", "shared")
    with_baseline = Release("i:t", "b:t", "a" * 40, "", "shared", baseline=fields)
    assert parse_record(record_text([with_baseline]))[0].baseline == fields
    assert '"baseline"' not in record_text([plain])  # an older record reads, and writes, as before
    assert parse_record(record_text([plain]))[0].baseline == ()
    assert with_baseline.identity == plain.identity  # a moved baseline is drift, not a release


def test_status_reads_the_baseline_and_the_recorded_one_in_its_one_read():
    record = record_text(
        [Release("i:t", "b:t", "a" * 40, "", "shared", baseline=(("kernel", "6.17.0-1"),))]
    )
    got = parse_rank_state(
        [
            "mtu=9000",
            *("bl." + x for x in baseline_report()),
            "release_record=" + "".join(record.splitlines()),
            END,
        ]
    )
    assert got.baseline is not None and got.baseline.kernel == SPARK_KERNEL
    assert got.recorded == (("kernel", "6.17.0-1"),)
    assert parse_rank_state(["mtu=9000", "release_record=", END]).baseline is None


def test_status_reads_the_baseline_and_the_record_with_a_real_shell(tmp_path):
    """status.py's one read (sparkrig.status.RankStatus) run by a real shell: this machine's
    baseline, and the one a release record kept, with what moved between them."""
    from sparkrig.status import RankStatus, baseline_problems

    record = tmp_path / "release.json"
    kept = (("kernel", "6.17.0-1032-nvidia"),)
    record.write_text(record_text([Release("i:t", "b:t", "a" * 40, "", "shared", baseline=kept)]))
    fact = RankStatus()
    none = str(tmp_path / "none")
    command = fact.command(
        unit="sparkrig-none", container="none", env_file=none, gid_file=none, iface="lo",
        lock=none, stamps=none, run_dir=none, record=str(record),
    )  # fmt: skip
    done = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True
    )
    st = fact.process(done.stdout.splitlines())
    assert st.baseline is not None and st.baseline.kernel == platform.release()
    assert st.recorded == kept
    (moved,) = baseline_problems(st)
    assert f"kernel 6.17.0-1032-nvidia -> {platform.release()}" in moved
