"""The facts' shell scripts (sparkrig/facts/*.sh): each one is run by a fact of the library, ends
its output with the end marker the parsers wait for, and gets its values as data, never as code
(``make check`` runs shellcheck on them)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from sparkrig import REPO
from sparkrig.factlines import END, script, script_command, script_inline

FACTS = REPO / "sparkrig" / "facts"
SCRIPTS = sorted(p.stem for p in FACTS.glob("*.sh"))
# the probe's output ends with the baseline's lines, which end with the marker (sparkrig/probe.py)
MARKED = set(SCRIPTS) - {"probe"}


def test_every_script_is_run_by_a_module_of_the_library():
    assert {"node", "baseline", "ports", "firewall", "probe"} <= set(SCRIPTS)
    calls = re.compile(r"script_(?:command|inline)\(\s*\"([a-z_]+)\"")
    used = {m for p in (REPO / "sparkrig").glob("*.py") for m in calls.findall(p.read_text())}
    assert used == set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(MARKED))
def test_the_script_ends_with_the_end_marker(name):
    assert script(name).rstrip("\n").endswith(f"echo '{END}'"), name
    assert "{" + "end}" not in script(name)  # no template left: the file is what runs


def test_a_value_reaches_the_script_as_data(tmp_path: Path):
    marker = tmp_path / "ran"
    hostile = f"$(touch {marker}); touch {marker}"
    command = script_command("firewall", hostile, "'")
    done = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == END
    inline = subprocess.run(
        ["sh", "-c", f"( {script_inline('firewall', hostile, '')} )"], capture_output=True
    )
    assert inline.returncode == 0 and not marker.exists()
