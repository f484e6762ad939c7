"""The host baseline through the real CLI against strict @fake hosts: ranks that differ are
refused before any change with a table, a known-bad combination with its reason, the kernel and
driver packages held (and not again), released on purpose, the kho=off GRUB drop-in, status's
baseline lines and drift, and no command more for any of it (sparkrig/baseline.py)."""

from __future__ import annotations

from sparkrig.baseline import GRUB_DROPIN, grub_text
from sparkrig.stateread import StateReadFailed
from tests.plan import fakehosts
from tests.plan.harness import Run, run
from tests.plan.test_plan import ACTION, HEAD, INVENTORY, WORKER, converge_state

NEW_KERNEL = "7.0.0-1019-nvidia"
SPARK_HELD = [
    name.format(k=fakehosts.SPARK_KERNEL) for name, _ in fakehosts.SPARK_PACKAGES
]  # every kernel and driver package of the fake Spark; linux-firmware and docker-ce are not


def apply(monkeypatch, *extra: str) -> Run:
    return run(["-y", *extra, INVENTORY, "deploy.py"], monkeypatch)


def changes(r: Run) -> list[str]:
    """Every command that changes a host (facts, fail_host and the state read excluded)."""
    return [
        c
        for cmds in r.commands.values()
        for c in cmds
        if ACTION.search(c) or fakehosts.APT_MARK.search(c) or fakehosts.UPDATE_GRUB.search(c)
    ]


def test_a_rank_on_another_kernel_is_refused_before_any_change_with_the_table(monkeypatch):
    fakehosts.inject("spark-b", {fakehosts.BASELINE: fakehosts.baseline_report(kernel=NEW_KERNEL)})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert changes(r) == [] and r.uploads == {}
    table = [
        line.strip() for line in r.output.splitlines() if "-nvidia" in line and "@fake" in line
    ]
    assert any(line.split()[:3] == ["0", HEAD, fakehosts.SPARK_KERNEL] for line in table), table
    assert any(line.split()[:3] == ["1", WORKER, NEW_KERNEL] for line in table), table
    assert "the ranks differ on kernel" in r.output and "baseline_mismatch_ok = True" in r.output
    for name in (HEAD, WORKER):  # each rank refuses: neither may be converged alone
        failed = [c for c in r.commands[name] if fakehosts.FAIL_HOST.search(c)]
        assert len(failed) == 1 and "the ranks differ on kernel" in failed[0], r.commands[name]


def test_a_kernel_mismatch_accepted_on_purpose_converges(monkeypatch):
    fakehosts.inject("spark-b", {fakehosts.BASELINE: fakehosts.baseline_report(kernel=NEW_KERNEL)})
    r = apply(monkeypatch, "--data", "baseline_mismatch_ok=True")
    assert r.exit_code == 0, r.output
    assert "(accepted: baseline_mismatch_ok)" in r.output


def test_a_driver_or_nic_firmware_mismatch_is_refused_too(monkeypatch):
    fakehosts.inject(
        "spark-b", {fakehosts.BASELINE: fakehosts.baseline_report(nic_fw="28.39.1002")}
    )
    r = apply(monkeypatch)
    assert r.exit_code != 0 and changes(r) == []
    assert "the ranks differ on nic_fw" in r.output and "28.39.1002" in r.output


def test_a_known_bad_combination_is_refused_with_its_reason_and_source(monkeypatch):
    """Both ranks on 7.0.0-1019 with kexec handover on by default and no kho=off: equal, so no
    table, but the catalogue's entry refuses each with its reason and its thread."""
    bad = fakehosts.baseline_report(kernel=NEW_KERNEL, kho=fakehosts.KHO_DEFAULT_ON)
    for short in ("spark-a", "spark-b"):
        fakehosts.inject(short, {fakehosts.BASELINE: bad})
    r = apply(monkeypatch)
    assert r.exit_code != 0 and changes(r) == [] and r.uploads == {}
    assert "the ranks differ" not in r.output
    failed = [c for c in r.commands[WORKER] if fakehosts.FAIL_HOST.search(c)]
    assert len(failed) == 1
    assert "known-bad baseline (kernel 7.0.0-1019-nvidia" in failed[0]
    assert "ibv_reg_mr_iova2: Cannot allocate memory" in failed[0]
    assert "MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks/issues/14" in failed[0]
    # the fix as a command: this run cannot write the drop-in (issue 49: the refusal gave none)
    grub = "sudo tee /etc/default/grub.d/90-sparkrig-kho.cfg && sudo update-grub && sudo reboot"
    assert f"""`echo 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX kho=off"' | {grub}`""" in r.output


def test_the_same_kernel_booted_with_kho_off_passes_and_keeps_its_drop_in(monkeypatch):
    """kho=off on the running command line: the entry no longer matches; the drop-in that keeps
    it so is written, update-grub regenerates the menu, and nothing reboots."""
    off = fakehosts.baseline_report(
        kernel=NEW_KERNEL,
        kho=fakehosts.KHO_DEFAULT_ON,
        cmdline="BOOT_IMAGE=/boot/vmlinuz-{k} root=UUID=0000 ro quiet splash kho=off",
    )
    for short in ("spark-a", "spark-b"):
        fakehosts.inject(short, {fakehosts.BASELINE: off})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        assert r.uploads[name][GRUB_DROPIN] == grub_text().encode()
        assert "update-grub" in r.commands[name]
        assert not [c for c in r.commands[name] if "reboot" in c]


def test_a_kernel_with_kho_built_in_gets_the_drop_in_for_the_next_boot_and_says_so(monkeypatch):
    """KHO built in but off by default (not known-bad): kho=off is ensured for the next boot,
    the output says it takes effect at the next reboot; a second run with the drop-in in place
    and the menu regenerated does nothing."""
    built = ("CONFIG_KEXEC_HANDOVER=y",)
    for short in ("spark-a", "spark-b"):
        fakehosts.inject(short, {fakehosts.BASELINE: fakehosts.baseline_report(kho=built)})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert r.uploads[WORKER][GRUB_DROPIN] == grub_text().encode()
    assert 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX kho=off"' in grub_text()
    assert "update-grub" in r.commands[WORKER]
    assert "kho=off is set for the next boot" in r.output and "never reboots" in r.output

    fakehosts.STATE.clear()
    converge_state()
    placed = fakehosts.baseline_report(kho=built, held=True, grub_kho=True)
    digest = __import__("hashlib").sha256(grub_text().encode()).hexdigest()
    for short in ("spark-a", "spark-b"):
        fakehosts.inject(
            short,
            {
                fakehosts.BASELINE: placed,
                fakehosts.owned_of(GRUB_DROPIN): f"file 644 root root {digest}",
            },
        )
    again = apply(monkeypatch)
    assert again.exit_code == 0, again.output
    assert "update-grub" not in again.commands[WORKER] and again.uploads == {}
    assert "Boot with kho=off from the next reboot (GRUB drop-in, update-grub)" not in (
        again.changed_ops.get(WORKER, [])
    )


def test_a_drop_in_left_when_the_kernel_has_no_kho_is_removed(monkeypatch):
    converge_state()
    fakehosts.inject("spark-b", {fakehosts.owned_of(GRUB_DROPIN): "file 644 root root " + "0" * 64})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert f"rm -f {GRUB_DROPIN}" in r.commands[WORKER] and "update-grub" in r.commands[WORKER]
    assert "update-grub" not in r.commands[HEAD]


def test_the_kernel_and_driver_packages_are_held_once(monkeypatch):
    r = apply(monkeypatch)  # bare DGX OS: nothing held
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        holds = [c for c in r.commands[name] if c.startswith("apt-mark ")]
        assert holds == ["apt-mark hold " + " ".join(sorted(SPARK_HELD))], holds

    fakehosts.STATE.clear()
    converge_state()  # held, as the first run left them
    again = apply(monkeypatch)
    assert again.exit_code == 0, again.output
    assert not [c for cmds in again.commands.values() for c in cmds if c.startswith("apt-mark")]
    assert again.changed_ops == {}


def test_accept_baseline_releases_the_hold_for_a_planned_upgrade(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--data", "accept_baseline=True")
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        marks = [c for c in r.commands[name] if c.startswith("apt-mark ")]
        assert marks == ["apt-mark unhold " + " ".join(sorted(SPARK_HELD))], marks
    assert "released for a planned upgrade" in r.output


def test_hold_baseline_off_holds_nothing(monkeypatch):
    r = apply(monkeypatch, "--data", "hold_baseline=False")
    assert r.exit_code == 0, r.output
    assert not [c for cmds in r.commands.values() for c in cmds if c.startswith("apt-mark")]


def test_the_baseline_costs_no_command_of_its_own(monkeypatch):
    """It is a part of the one state read: a converged pair's -y run sends the baseline script
    only inside each host's single state read."""
    converge_state()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for name, cmds in r.commands.items():
        reads = [c for c in cmds if "/proc/sys/kernel/osrelease" in c]
        assert len(reads) == 1 and "##SPARKRIG-PART baseline" in reads[0], (name, len(reads))


def test_the_release_record_keeps_the_baseline_the_gates_passed_on(monkeypatch):
    """A pair that moved to another driver (both ranks, so no mismatch) and passes its gates:
    the record is written again with the new baseline; the release itself did not change."""
    import json

    from sparkrig.release import parse_record

    converge_state()
    moved = fakehosts.baseline_report(driver="580.173.02", held=True)
    for short in ("spark-a", "spark-b"):
        fakehosts.inject(short, {fakehosts.BASELINE: moved})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert "baseline moved since the gates last passed: driver 580.95.05 -> 580.173.02" in r.output
    record = r.uploads[WORKER]["/etc/sparkrig/release.json"].decode()
    serving = parse_record(record)[0]
    assert dict(serving.baseline)["driver"] == "580.173.02"
    assert json.loads(record)["releases"][0]["baseline"]["kernel"] == fakehosts.SPARK_KERNEL


def test_status_prints_the_baseline_and_fails_a_rank_whose_baseline_moved(monkeypatch):
    converge_state()
    r = run(["-y", INVENTORY, "status.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert (
        f"rank1 baseline: kernel {fakehosts.SPARK_KERNEL} (KHO not built), driver 580.95.05 "
        "(open), NIC firmware 28.45.4028" in r.output
    )
    assert "| as recorded when the gates passed" in r.output

    fakehosts.STATE.clear()
    converge_state()
    st = fakehosts.STATE["spark-b"][fakehosts.RANK_STATUS]
    now = fakehosts.baseline_report(kernel=NEW_KERNEL, held=True)
    rest = [x for x in st if not x.startswith("bl.")]  # ends: release_record=..., END
    moved = [*rest[:-2], *("bl." + x for x in now), *rest[-2:]]
    fakehosts.inject("spark-b", {fakehosts.RANK_STATUS: moved})
    r = run(["-y", INVENTORY, "status.py"], monkeypatch)
    assert r.exit_code != 0
    failed = [c for c in r.commands[WORKER] if fakehosts.FAIL_HOST.search(c)]
    assert len(failed) == 1 and f"kernel {fakehosts.SPARK_KERNEL} -> {NEW_KERNEL}" in failed[0]
    assert not [c for c in r.commands[HEAD] if fakehosts.FAIL_HOST.search(c)]


def test_a_garbled_baseline_fails_its_host_in_one_line_and_nothing_changes(monkeypatch):
    garbled = [
        "pkg=ii linux-image-x 1" if x.startswith("pkg=ii |linux-firmware") else x
        for x in fakehosts.baseline_report()
    ]
    fakehosts.inject("spark-b", {fakehosts.BASELINE: garbled})
    r = apply(monkeypatch)
    assert r.exit_code != 0 and changes(r) == []
    shown = getattr(r.exception, "exception", r.exception)  # pyinfra_cli's WrappedError
    assert isinstance(shown, StateReadFailed), repr(r.exception)
    line = str(shown)  # the failed read in one line (tests/plan/test_state_read.py)
    assert line.startswith(f"{WORKER}: state read: baseline: baseline: unreadable package line")
    assert HEAD not in line
