"""A seeded chaos campaign on the lab (docs/chaos.md): python3 -m bench.chaos [options]

  --list                        the catalogue: every fault's apply/undo commands and the checks
  --plan --seed S --faults N    the sequence seed S draws, without touching the lab
  --seed S --faults N           boot the lab, converge, then apply, run, check N faults
  --only KIND[,KIND...]         draw only these kinds (repeatable)
  --pick N[,N...]               run only these faults of the drawn sequence (a replay of some)
  --merge DIR --merge DIR --out DIR
                                one report of a sequence run in parts: a later part's result
                                for a fault replaces an earlier one's (touches no lab)

Run from the repository root, as root (the lab needs it). The seed is printed first; any
campaign replays with the same --seed, --faults and --only. Reports: <out>/report.json and
<out>/report.md, one log per fault beside them (bench/chaos/README.md)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench.chaos import checks, report
from bench.chaos.catalogue import CATALOGUE, WORK, fill
from bench.chaos.draw import Draw, kinds_allowed, new_seed, plan
from bench.chaos.runner import campaign, draw_values, placeholders
from lab import REPO, STATE_FILE


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python3 -m bench.chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--list", action="store_true", help="print the catalogue and the checks")
    ap.add_argument("--plan", action="store_true", help="print the drawn sequence and stop")
    ap.add_argument("--seed", type=int, help="replay this seed (default: a new one, printed)")
    ap.add_argument("--faults", type=int, default=50, help="how many faults (default 50)")
    ap.add_argument("--only", action="append", default=[], help="fault kinds to draw from")
    ap.add_argument("--pick", action="append", default=[], help="run only these fault numbers")
    ap.add_argument("--out", type=Path, help="report directory (default .lab/chaos/<time>-seed<S>)")
    ap.add_argument("--no-up", action="store_true", help="use the running lab as it is")
    ap.add_argument("--no-converge", action="store_true", help="skip the first converge")
    ap.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to every pyinfra run, e.g. stack=tensorfold")  # fmt: skip
    ap.add_argument("--merge", action="append", default=[], type=Path, metavar="DIR",
                    help="a part's report directory, in run order (with --out)")  # fmt: skip
    ap.add_argument("--settle", type=float, default=600, help="seconds the pair may take to serve")
    args = ap.parse_args(argv)
    args.only = [k for item in args.only for k in item.split(",") if k]
    try:
        args.pick = sorted({int(n) for item in args.pick for n in item.split(",") if n})
    except ValueError:
        ap.error("--pick takes fault numbers: --pick 17,39")
    if any(not 1 <= n <= args.faults for n in args.pick):
        ap.error(f"--pick: fault numbers are 1..{args.faults} (--faults)")
    if args.merge and not args.out:
        ap.error("--merge writes the merged report to --out DIR")
    missing = [str(d) for d in args.merge if not (d / "report.json").is_file()]
    if missing:
        ap.error(f"--merge: no report.json in {', '.join(missing)}")
    return args


def print_catalogue() -> None:
    _, values = placeholders(None)
    print("Faults (commands run as root on the target guest; {placeholders} filled per draw)\n")
    for f in CATALOGUE:
        target = "head or worker (drawn)" if f.target == "any" else f.target
        print(f"{f.kind}  [{f.mode}{', REFUSED: ' + repr(f.refused) if f.refused else ''}]")
        print(f"  {f.summary}; on the {target}; covers: {f.covers}")
        if f.apply:
            print(f"  apply: {fill(f.apply, values['worker'])}")
        if f.undo:
            print(f"  undo:  {fill(f.undo, values['worker'])}")
        if "work" in f.params:
            print(f"  work (drawn, applied first): {', '.join(WORK)}")
        if f.params:
            print(f"  drawn: {', '.join(f.params)}")
        print(f"  may restart: everywhere {list(f.restarts)}, on the target "
              f"{list(f.restarts_on_target)}\n")  # fmt: skip
    print("Checks after each fault (the pair is whole when none finds a problem)\n")
    for name, command in checks.commands():
        print(f"{name}:\n  {command}\n")


def print_plan(draws: list[Draw]) -> None:
    # the running lab's values when there is one (read only; the lab is not touched)
    _, values = placeholders(json.loads(STATE_FILE.read_text()) if STATE_FILE.exists() else None)
    for d in draws:
        print(d.describe())
        if d.fault.apply and d.fault.mode != "ssh-cut":
            print(f"       {fill(d.fault.apply, draw_values(values, d))}")
        if "work" in d.params:
            work = fill(next(f for f in CATALOGUE if f.kind == d.params["work"]).apply,
                        draw_values(values, d))  # fmt: skip
            print(f"       work: {work}")


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.list:
        print_catalogue()
        return 0
    if args.merge:
        try:
            result = report.merge([report.load(d / "report.json") for d in args.merge])
        except ValueError as e:
            raise SystemExit(f"--merge: {e}") from None
        args.out.mkdir(parents=True, exist_ok=True)
        js, md = result.write(args.out)
        print(result.markdown())
        print(f"reports: {js}, {md}")
        return 0 if result.healed() == result.total() else 1
    try:
        kinds_allowed(args.only)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    seed = args.seed if args.seed is not None else new_seed()
    replay = f"python3 -m bench.chaos --seed {seed} --faults {args.faults}" + "".join(
        f" --only {shlex.quote(k)}" for k in args.only
    )
    replay += "".join(f" --data {shlex.quote(kv)}" for kv in args.data)
    if args.pick:
        replay += f" --pick {','.join(map(str, args.pick))}"
    print(f"seed {seed} (replay: {replay})", flush=True)
    draws = [d for d in plan(seed, args.faults, args.only) if not args.pick or d.index in args.pick]
    if args.plan:
        print_plan(draws)
        return 0
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or REPO / ".lab" / "chaos" / f"{stamp}-seed{seed}"
    result = campaign(
        draws, seed, args.only, out, replay,
        up=not args.no_up, converge=not args.no_converge, settle_s=args.settle,
        echo=lambda line: print(line, flush=True), data=args.data,
    )  # fmt: skip
    print(result.markdown())
    print(f"reports: {out}/report.json, {out}/report.md")
    return 0 if result.healed() == result.total() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
