"""What a re-check of a converged pair costs, counted as the remote commands each fake host is
asked (facts and actions), not timed: at most GOAL per host for ``--dry`` (with ``--diff``, as
reviewers run it) and for the ``-y`` no-op, and no more on four nodes than on two (issue 12).

Before the one state read per host (sparkrig/hoststate.py) a converged pair cost 58 commands on
the head and 54 on each worker for ``--dry``, 51/47 for ``-y``; after it, 3/2 and 4/3."""

from __future__ import annotations

import re
from glob import glob

import pytest

from sparkrig import hostpkg
from sparkrig.baseline import GRUB_DROPIN
from tests.plan import fakehosts
from tests.plan.harness import Run, run

GOAL = 12  # remote commands per host, whatever the number of nodes
HEAD = "@fake/spark-a"
INVENTORIES = {2: "tests/plan/inventory_state.py", 4: "tests/plan/inventory_4state.py"}
MODES = {"dry": ["--dry", "--diff"], "apply": ["-y"]}


def converged_run(monkeypatch, nodes: int, mode: str) -> Run:
    inventory = INVENTORIES[nodes]
    for name, s in fakehosts.settings_of(inventory).items():
        fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(s)
    prompted = mode == "prompted"  # no -y: the operator presses enter at pyinfra's prompt
    args = [] if prompted else MODES[mode]
    r = run([*args, inventory, "deploy.py"], monkeypatch, stdin="\n" if prompted else None)
    assert r.exit_code == 0, r.output
    if mode != "dry":  # (--dry lists _if-gated operations as changes: pyinfra's way)
        assert r.changed_ops == {}, r.changed_ops  # converged: the count is the no-op's
    assert len(r.commands) == nodes
    return r


def per_role(r: Run) -> dict[str, int]:
    """The most commands any head / any worker was asked."""
    worker = max(len(c) for name, c in r.commands.items() if name != HEAD)
    return {"head": len(r.commands[HEAD]), "worker": worker}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_converged_pair_is_checked_in_a_dozen_commands_per_host_whatever_the_nodes(
    monkeypatch, mode
):
    counts = {nodes: per_role(converged_run(monkeypatch, nodes, mode)) for nodes in INVENTORIES}
    for nodes, roles in counts.items():
        for role, count in roles.items():
            assert count <= GOAL, f"{mode}, {nodes} nodes: the {role} was asked {count} commands"
    assert counts[4] == counts[2], f"{mode}: the count grows with the nodes: {counts}"


def test_dry_reads_each_hosts_state_once_whoever_asks(monkeypatch):
    """The head looks at every worker's node, image and weights: those looks share the
    worker's own read (one state read per host), and nothing else reads a file or a unit."""
    r = converged_run(monkeypatch, 4, "dry")
    for name, commands in r.commands.items():
        reads = [c for c in commands if c.startswith("sh -c ") and "##SPARKRIG-PART" in c]
        assert len(reads) == 1, f"{name}: {len(reads)} state reads"
        others = [c[:80] for c in commands if c not in reads]
        assert all(c.startswith(("ping -M do", f"{hostpkg.PYTHON} ")) for c in others), others


@pytest.mark.parametrize(("mode", "reads"), [("apply", 1), ("prompted", 2)])
def test_a_yes_run_decides_from_its_preparing_read_and_a_prompted_run_reads_again(
    monkeypatch, mode, reads
):
    """With ``-y`` execution follows preparation at once: the state read while preparing is
    the one execution decides from, so a no-op reads each host once. Without it the operator
    may sit at pyinfra's prompt for minutes, so execution reads every host again."""
    r = converged_run(monkeypatch, 2, mode)
    for name, commands in r.commands.items():
        whole = [c for c in commands if "##SPARKRIG-PART node" in c]
        assert len(whole) == reads, f"{name}: {len(whole)} whole state reads"


def test_dry_diff_shows_every_file_the_run_would_write(monkeypatch):
    """New owned files diffed in full, a differing one against its current content (read only
    then), secrets never; a right file shows nothing."""
    from sparkrig.hoststate import owned_files
    from sparkrig.paths import paths

    bare = run(["--dry", "--diff", INVENTORIES[2], "deploy.py"], monkeypatch)
    assert bare.exit_code == 0, bare.output
    everyone = fakehosts.settings_of(INVENTORIES[2])
    secrets = {f"/etc/sparkrig/{n}" for n in ("pair-token", "hf-token", "api-key", "api-key.env")}
    secrets.add("/etc/sparkrig/api-front-key.conf")  # the API front's key include
    # the front's TLS pair: owned (removed) while it serves HTTP (tls_cert None)
    secrets |= {"/etc/sparkrig/api-front.crt", "/etc/sparkrig/api-front.key"}
    for s in everyone.values():
        watchdog = paths(s).watchdog_unit  # owned (removed) while the watchdog is off
        clock = paths(s).gpu_clock_unit  # owned (removed) while gpu_clock_max_mhz is None
        legacy = set(hostpkg.legacy_files(s.knobs.install_dir))  # owned to be removed
        grub = GRUB_DROPIN  # owned (removed) while the kernel has no KHO
        for path in set(owned_files(s)) - secrets - {watchdog, clock, grub} - legacy:
            assert f"Will create {path}" in bare.output, path
    assert "Will write /etc/sparkrig/pair-token (secret: content not shown)" in bare.output
    assert "Will write /etc/sparkrig/api-front-key.conf (secret: content not shown)" in bare.output
    assert "Will create /etc/nginx/conf.d/sparkrig-api.conf" in bare.output

    worker = "@fake/spark-b"
    unit = paths(everyone[worker]).rank_unit
    for name, s in everyone.items():
        older = {unit: (b"[Unit]\nDescription=older\n", "644")} if name == worker else {}
        fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(s, files=older)
    r = run(["--dry", "--diff", INVENTORIES[2], "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert f"Will modify {unit}" in r.output
    assert "  - Description=older\n" in r.output
    assert "  + Description=sparkrig worker: vLLM rank 1 of 2\n" in r.output
    modified = {
        line.split("Will modify ")[1] for line in r.output.splitlines() if "Will mod" in line
    }
    assert modified == {unit} and "Will create" not in r.output
    reads = [c for c in r.commands[worker] if c.startswith(f"( test -e {unit} && cat")]
    assert len(reads) == 1  # the current content, read for the diff alone


def parts_read(command: str) -> list[str]:
    return re.findall(r"##SPARKRIG-PART ([^'\s]+)", command)


def test_a_first_run_rereads_only_the_parts_an_operation_asks_for(monkeypatch):
    """A first run changes something at nearly every operation, and every change makes the
    state stale; re-reading every part each time (node report, image, weights, ...) was about
    45 whole reads per host, 11 of the lab's 26 minutes. The whole state is read while
    preparing (with ``-y`` that read serves execution until the first change); after a change
    only the parts the operation looks at (the node report, which no operation looks at, is not
    read again)."""
    r = run(["-y", INVENTORIES[2], "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    for name, commands in r.commands.items():
        reads = [parts_read(c) for c in commands if "##SPARKRIG-PART" in c]
        whole = [parts for parts in reads if "node" in parts]
        assert len(whole) == 1, f"{name}: the whole state was read {len(whole)} times"
        later = reads[len(whole) :]
        assert len(later) > 20 and all(len(parts) <= 2 for parts in later), (name, reads)


def test_placing_an_operation_never_scans_every_module_for_a_deploy_file(monkeypatch):
    """pyinfra places each operation by walking its stack, and ``inspect`` looks each frame's
    file up among the modules; for the exec'd deploy and task files that was a scan of all of
    ``sys.modules`` per frame (most of the control side's time). At most one scan per run."""
    import inspect
    import os

    deploy_files = {os.path.abspath("deploy.py"), *map(os.path.abspath, glob("tasks/*.py"))}
    real_getmodule = inspect.getmodule
    scans: list[str] = []

    def getmodule(obj, _filename=None):
        if _filename is not None:
            path = os.path.normcase(os.path.abspath(_filename))
            if path in deploy_files and path not in inspect.modulesbyfile:
                scans.append(path)
        return real_getmodule(obj, _filename)

    monkeypatch.setattr(inspect, "getmodule", getmodule)
    converged_run(monkeypatch, 2, "apply")
    assert len(scans) <= 1, f"{len(scans)} scans of sys.modules, e.g. for {scans[-1]}"
