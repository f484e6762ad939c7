"""The host package files/sparkhost: stdlib only, one module per job, every job runs from a
copy installed the way the deploy installs it, and ``uses`` knows what each job loads (what a
changed module restarts)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkrig import hostpkg

TORCH_ONLY_IN = {"nccl_smoke.py"}  # runs in the serving image, imports torch when it runs


def imports(module: str) -> list[tuple[str, bool]]:
    """(top-level name, at module level) of every import in a package module."""
    tree = ast.parse(hostpkg.source(module).read_text())
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module.split(".")[0], id(node) in top))
    return found


@pytest.mark.parametrize("module", hostpkg.modules())
def test_every_module_imports_the_standard_library_and_the_package_alone(module):
    for name, at_top in imports(module):
        if name == "sparkhost":
            assert at_top, f"{module}: imports sparkhost lazily (a running helper must hold it)"
        elif name == "torch":
            assert module in TORCH_ONLY_IN and not at_top, module
        else:
            assert name in sys.stdlib_module_names or name == "__future__", (module, name)


def test_every_job_has_its_module_and_every_module_is_shipped():
    jobs = hostpkg.jobs()
    assert {"fetch", "verify", "state", "serve", "routes", "follow", "prep", "gate", "pair",
            "nccl-smoke", "imageload", "why", "runtime", "soak"} == set(jobs)  # fmt: skip
    shipped = set(hostpkg.modules())
    assert {f"{m}.py" for m in jobs.values()} <= shipped
    assert {"__init__.py", "__main__.py", "tokenfile.py", "lockfile.py", "gid.py",
            "units.py"} <= shipped  # fmt: skip
    assert hostpkg.remote_files("/opt/sparkrig") == [
        f"/opt/sparkrig/lib/sparkhost/{m}" for m in sorted(shipped)
    ]
    with pytest.raises(KeyError):
        hostpkg.command("/opt/sparkrig", "sparkrig-fetch")


def test_uses_follows_the_imports_all_the_way_down():
    pair = hostpkg.uses("pair")
    assert {"pair.py", "tokenfile.py", "units.py", "__init__.py", "__main__.py"} <= pair
    assert not pair & {"fetch.py", "prep.py", "gid.py", "gate.py", "lockfile.py"}
    fetch = hostpkg.uses("fetch")
    # fetch -> stamps -> lockfile; fetch -> routes; fetch -> tokenfile
    assert {"fetch.py", "stamps.py", "lockfile.py", "routes.py", "tokenfile.py"} <= fetch
    assert {"prep.py", "gid.py"} <= hostpkg.uses("prep")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The package as the deploy lays it out on a host: <install_dir>/lib/sparkhost, beside
    a module named like one of the standard library's in the package (``token``) would shadow."""
    root = tmp_path_factory.mktemp("opt")
    dest = Path(hostpkg.remote_dir(str(root)))
    dest.mkdir(parents=True)
    for module in hostpkg.modules():
        shutil.copy(hostpkg.source(module), dest / module)
    (dest / "token.py").write_text("raise SystemExit('the package directory shadowed token')\n")
    return dest


@pytest.mark.parametrize("job", sorted(hostpkg.jobs()))
def test_every_job_runs_from_an_installed_copy(installed, job, tmp_path):
    argv = hostpkg.command(str(installed.parents[1]), job, "--help")
    assert argv[:3] == [hostpkg.PYTHON, str(installed), job]
    out = subprocess.run([sys.executable, "-I", *argv[1:]], capture_output=True, text=True,
                         cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


def test_an_unknown_job_is_refused_with_the_list(installed):
    out = subprocess.run([sys.executable, str(installed), "nope"], capture_output=True, text=True)
    assert out.returncode == 2 and "jobs: fetch, verify" in out.stderr


def test_one_secret_reader_for_every_secret(tmp_path, capsys):
    """The hosts' readers (Hub token, pair secret, API key) and the control side's read through
    sparkhost.tokenfile: surrounding whitespace dropped, never printed."""
    from sparkhost import gate
    from sparkhost.tokenfile import read_secret

    from sparkrig import pairsecret

    f = tmp_path / "secret"
    f.write_text("  s3cret\n\n")
    f.chmod(0o644)
    assert read_secret(str(f)) == "s3cret"
    assert read_secret(str(f), warn_shared=True) == "s3cret"
    err = capsys.readouterr().err
    assert "readable by group/others" in err and "s3cret" not in err
    f.chmod(0o600)
    read_secret(str(f), warn_shared=True)
    assert capsys.readouterr().err == ""
    assert gate.read_api_key(str(f)) == "s3cret"
    assert pairsecret.control_token(str(f)) == "s3cret"  # the pair secret and the API key
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert read_secret(str(empty)) is None
    with pytest.raises(ValueError, match="is empty"):
        gate.read_api_key(str(empty))


def test_the_control_side_imports_the_shipped_package_by_the_checkouts_link():
    """``import sparkhost`` finds files/sparkhost through the checkout's ``sparkhost`` link in a
    fresh interpreter that imports nothing of sparkrig first (a tool, a lab script)."""
    root = hostpkg.SOURCE.parents[1]
    assert (root / "sparkhost").is_symlink()
    code = "import pathlib, sparkhost.gid; print(pathlib.Path(sparkhost.gid.__file__).resolve())"
    said = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert Path(said.stdout.strip()) == hostpkg.source("gid.py")
