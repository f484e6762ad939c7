"""The switch of a converged pair to the `tensorfold` stack, in plan (issue 34): `--dry --diff`
shows every file the switch changes (the rank units run `tensorfold serve` with the recipe's
container flags, the watchdog reads TensorFold's /health), and preflight refuses the stack
before any change on a node whose MemTotal cannot hold its 110 GiB MemAvailable floor."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from sparkrig.stacks.tensorfold import STACK
from tests.plan import fakehosts
from tests.plan.harness import run
from tests.plan.test_plan import INVENTORY, apply, converge_state, refused_before_any_change

LOCKS = Path("tests/plan/locks")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tf_locks(tmp: Path) -> str:
    """The plan tests' lockfiles plus one for the stack's target at its pin (made like theirs)."""
    for lock in LOCKS.glob("*.lock.json"):
        shutil.copy(lock, tmp / lock.name)
    data = json.loads((LOCKS / "LibertAIDAI--GLM-5.3-Flash-NVFP4.lock.json").read_text())
    pin = STACK.model
    data.update(repo=pin.repo, commit=pin.revision, revision=pin.revision)
    (tmp / f"{pin.repo.replace('/', '--')}.lock.json").write_text(json.dumps(data))
    return str(tmp)


def switch(tmp: Path) -> list[str]:
    # profile single: no drafter file, so no licence to accept; the fakes answer no Hub
    return ["--data", "stack=tensorfold", "--data", "profile=single",
            "--data", f"lockfile_dir={tf_locks(tmp)}", "--data", "reach_check=False"]  # fmt: skip


def test_dry_diff_of_the_switch_to_tensorfold_shows_the_changed_files(monkeypatch, tmp_path):
    converge_state()
    dry = run(["--dry", "--diff", *switch(tmp_path), INVENTORY, "deploy.py"], monkeypatch)
    assert dry.exit_code == 0, dry.output
    out = ANSI.sub("", dry.output)
    shown = set(re.findall(r"Will (?:modify|create) (/\S+)", out))
    assert {
        "/etc/sparkrig/rank.env",
        "/etc/systemd/system/sparkrig-head.service",
        "/etc/systemd/system/sparkrig-worker.service",
        "/etc/systemd/system/sparkrig-watchdog.service",
    } <= shown
    assert "release changes (stack vllm-nvfp4, image" in out and "-> stack tensorfold" in out
    for words in ("--entrypoint tensorfold", "--shm-size 16g", "serve", "--master-port 29551",
                  "--host 127.0.0.1", "--drafter none", "TENSORFOLD_NO_UPDATE_CHECK=1",
                  "--progress-parser tensorfold-health",
                  "--memfree-min-gib 110 --memory-measure available"):  # fmt: skip
        assert words in out, words


def test_preflight_refuses_tensorfold_where_memtotal_cannot_hold_its_floor(monkeypatch, tmp_path):
    converge_state()
    node = fakehosts.node_report(memtotal_kb=100 * 1024**2)
    fakehosts.inject("spark-b", {fakehosts.NODE: node})
    r = apply(monkeypatch, *switch(tmp_path))
    refused_before_any_change(
        r,
        "memory: stack tensorfold starts only with MemAvailable >= 110 GiB on every node ("
        f"{STACK.memory.source}); MemTotal here is 100.0 GiB, so no start could pass its "
        "gate",
    )
