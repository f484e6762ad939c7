#!/usr/bin/env python3
"""What the control side alone spends on a no-op, by number of nodes (issue 12; run by hand).

  python3 bench/noop/bench_control.py [--nodes 2 4 8] [--runs 5] [--out results-control.json]

The lab's no-op time mixes pyinfra's work on this machine with the guests' (four TCG guests on
two cores each get half the CPU two did). Here the hosts are the plan tests' strict ``@fake``
hosts holding a converged pair's canned state, so every second is the control side's: loading
the inventory, preparing every operation for every host, and executing them (the fake connector
answers at once). Each figure is a fresh process (``--one``), timed around the CLI alone;
``--no-index`` runs without ``sparkrig.ordering.index_deploy_files`` (pyinfra then scans every
module for each frame of the deploy files while it places an operation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

INVENTORY = """from tests.plan.fakehosts import STATE, host

head = [host("spark-0", "192.168.100.10", responses=STATE.get("spark-0"))]
worker = [
    host(f"spark-{{i}}", f"192.168.100.{{10 + i}}", responses=STATE.get(f"spark-{{i}}"))
    for i in range(1, {nodes})
]
"""


def one(nodes: int, index: bool) -> float:
    """Seconds of one converged no-op (``-y``) on ``nodes`` fake hosts, in this process."""
    sys.path.insert(0, str(ROOT))
    from _pytest.monkeypatch import MonkeyPatch

    import sparkrig.ordering
    from tests.plan import fakehosts
    from tests.plan.harness import run

    with tempfile.NamedTemporaryFile("w", suffix=".py", dir=ROOT / "tests/plan") as inv:
        inv.write(INVENTORY.format(nodes=nodes))
        inv.flush()
        for name, s in fakehosts.settings_of(inv.name).items():
            fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(s)
        patch = MonkeyPatch()
        if not index:
            patch.setattr(sparkrig.ordering, "index_deploy_files", lambda: None)
        start = time.monotonic()
        r = run(["-y", inv.name, "deploy.py"], patch)
        took = time.monotonic() - start
    if r.exit_code != 0 or r.changed_ops:
        raise SystemExit(f"not a no-op on {nodes} nodes: {r.changed_ops or r.output[-2000:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--no-index", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(round(one(a.one, not a.no_index), 3))
        return 0
    results: dict[str, dict[str, object]] = {}
    for label, extra in (("index", []), ("no_index", ["--no-index"])):
        for nodes in a.nodes:
            runs = []
            for _ in range(a.runs):
                cmd = [sys.executable, __file__, "--one", str(nodes), *extra]
                out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
                runs.append(float(out.stdout.split()[-1]))
            median = statistics.median(runs)
            results.setdefault(label, {})[str(nodes)] = {"runs": runs, "median_s": median}
            print(f"{label:9} {nodes} nodes: {median:.2f} s median of {runs}", flush=True)
    for label, by_nodes in results.items():
        base = by_nodes[str(a.nodes[0])]["median_s"]
        for nodes in a.nodes[1:]:
            ratio = by_nodes[str(nodes)]["median_s"] / base  # type: ignore[operator]
            print(f"{label:9} {nodes} nodes / {a.nodes[0]}: {ratio:.2f}x")
    if a.out:
        a.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
