"""An upgrade of sparkrig whose routes program changed repairs the uplink policy tables an older
fetch left (files/sparkhost/routes.py: the uplink's own subnet in its table), on the hosts whose
fetch binds two uplinks, and nowhere else; a run that leaves the program alone does not."""

from __future__ import annotations

from sparkrig import hostpkg
from tests.plan import fakehosts
from tests.plan.harness import run

INVENTORY = "tests/plan/inventory_state.py"  # spark-a: two uplinks; spark-b: one


def repairs(monkeypatch, old_program: bool) -> dict[str, list[str]]:
    for name, s in fakehosts.settings_of(INVENTORY).items():
        routes = f"{hostpkg.remote_dir(s.knobs.install_dir)}/routes.py"
        files = {routes: (b"# the routes program of an older sparkrig\n", "644")}
        fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(
            s, files=files if old_program else None
        )
    r = run(["-y", INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    return {
        name: [c for c in commands if " routes " in c and c.endswith(" --repair")]
        for name, commands in r.commands.items()
    }


def test_an_upgraded_routes_program_repairs_the_tables_where_two_uplinks_fetch(monkeypatch):
    done = repairs(monkeypatch, old_program=True)
    assert [c.split(" routes ", 1)[1] for c in done["@fake/spark-a"]] == [
        "--uplink=enP7s7 --uplink=wlP9s9 --repair"
    ]
    assert done["@fake/spark-b"] == []  # one uplink: its fetch installs no policy routing


def test_a_run_that_leaves_the_routes_program_alone_repairs_nothing(monkeypatch):
    assert repairs(monkeypatch, old_program=False) == {"@fake/spark-a": [], "@fake/spark-b": []}
