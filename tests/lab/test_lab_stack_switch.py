"""The stack layer on the lab (issue 33): the converged pair switched to another stack and back,
a stack whose engine never becomes ready rolled back, and the compare table of two stacks.

Each stack runs its own stand-in image (lab/image.py: one per engine flavour, the flavour baked
into the image) and its own small fake Hub repos (lab/inventory.py ``stack_pins``), so a switch
changes the image, the weights, the argv and the env as it does on real Sparks. Ordered: each test
builds on the state the previous one left.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lab.guest import API_KEY, GATE_URL, SPARKHOST
from tests.lab.conftest import ROOT, STATE, Lab, pyinfra

pytestmark = pytest.mark.lab
INV = "lab/inventory.py"
SWITCH_TO = "entrpi-exl3"
# the engine flavour each stack's stand-in image answers as (lab/standin_flavour.py)
FLAVOUR = {"vllm-nvfp4": "vllm-0.33", SWITCH_TO: "entrpi-fork"}


def lab_state() -> dict:
    return json.loads(STATE.read_text())


def running_image(guest) -> str:
    """The image reference the rank's container was started from."""
    return guest.sh(f"docker inspect --format '{{{{.Config.Image}}}}' {guest.container}").strip()


def flavour(guest) -> str:
    """The engine flavour the rank's stand-in answers as (baked into its image)."""
    return guest.sh(f"docker exec {guest.container} printenv SPARKRIG_STANDIN_ENGINE").strip()


def gates_pass(lab: Lab) -> list[dict]:
    out = lab.head.sh(
        f"{SPARKHOST} gate gates {GATE_URL} --model glm-5.3-flash --api-key-file {API_KEY}"
    )
    gates = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(gates) == 5 and all(g["ok"] for g in gates), gates
    return gates


def model_dirs(guest) -> list[str]:
    out = guest.sh("ls -d /var/lib/sparkrig/models/model-* 2>/dev/null; true")
    return sorted(out.split())


def assert_serves(lab: Lab, stack: str) -> None:
    """Every rank runs ``stack``'s stand-in (its engine flavour; for a stack without sparkrig's
    patch layer, the local tag of that stand-in's digest) and the five gates pass."""
    digest = lab_state()["stack_images"][stack].rpartition("sha256:")[2]
    for g in lab.guests:
        image = running_image(g)
        if stack != "vllm-nvfp4":  # patched=False: the base runs as the local base-<digest> tag
            assert image.endswith(f"base-{digest}"), (g.name, image)
        assert flavour(g) == FLAVOUR[stack], g.name
    gates_pass(lab)


def test_stacks_converged_on_the_default_stack(lab: Lab):
    r = pyinfra("-y", INV, "deploy.py")
    assert r.rc == 0, r.output[-6000:]
    assert_serves(lab, "vllm-nvfp4")


def weights_dir_of(stack: str) -> str:
    return f"/var/lib/sparkrig/models/model-{lab_state()['stack_pins'][stack]['model_revision']}"


def test_switch_to_entrpi_exl3_passes_the_gates_and_the_next_dry_run_plans_nothing(lab: Lab):
    serving = {v: k for k, v in FLAVOUR.items()}[flavour(lab.head)]
    r = pyinfra("-y", INV, "deploy.py", "--data", f"stack={SWITCH_TO}")
    assert r.rc == 0, r.output[-6000:]
    assert_serves(lab, SWITCH_TO)
    # the weights of the stack that served before stay beside the new one's (those of a release
    # before it, e.g. a tensorfold stack a lab ran earlier, are pruned: keep_releases)
    for g in lab.guests:
        after = model_dirs(g)
        assert {weights_dir_of(serving), weights_dir_of(SWITCH_TO)} <= set(after), (g.name, after)
    dry = pyinfra("--dry", INV, "deploy.py", "--data", f"stack={SWITCH_TO}")
    assert dry.rc == 0, dry.output[-4000:]
    assert "Will change" not in dry.output and "Will create" not in dry.output, dry.output[-4000:]


def test_switch_back_to_the_default_stack(lab: Lab):
    r = pyinfra("-y", INV, "deploy.py")
    assert r.rc == 0, r.output[-6000:]
    assert_serves(lab, "vllm-nvfp4")


def test_a_stack_whose_engine_never_becomes_ready_is_rolled_back(lab: Lab):
    """From whichever stack serves now (a `-k` selection may skip the switch back), a release of
    ``entrpi-exl3`` whose engine never answers /health fails the run, and the stack that served
    before serves again and passes its gates."""
    before = {v: k for k, v in FLAVOUR.items()}[flavour(lab.head)]
    never = lab_state()["image_never_ready"]
    r = pyinfra(
        "-y", INV, "deploy.py", "--data", f"stack={SWITCH_TO}", "--data", f"base_image={never}"
    )
    assert r.rc != 0
    assert "previous release serves again" in r.output, r.output[-6000:]
    assert_serves(lab, before)


def test_compare_two_stacks_with_seed_004s_protocol(lab: Lab, tmp_path):
    """One seed-004 run per stack (the pair switched between them), then one table and one
    figure side by side, each stack against its own published figures."""
    out_dir = ROOT / ".lab" / "compare"
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for stack, data in (("vllm-nvfp4", []), (SWITCH_TO, ["--data", f"stack={SWITCH_TO}"])):
        if data:
            r = pyinfra("-y", INV, "deploy.py", *data)
            assert r.rc == 0, r.output[-6000:]
        result = out_dir / f"{stack}.json"
        bench = subprocess.run(
            [sys.executable, "-m", "sparkrig.bench", "--inventory", INV, "--protocol", "seed004",
             "--stack", stack, "--json", str(result)],
            cwd=ROOT, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
        results.append(str(result))
    compare = subprocess.run(
        [sys.executable, "-m", "sparkrig.bench", "compare", *results, "--out",
         str(out_dir / "compare")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert compare.returncode == 0, compare.stdout + compare.stderr
    print(compare.stdout)
    assert "vllm-nvfp4" in compare.stdout and SWITCH_TO in compare.stdout
    assert (out_dir / "compare.svg").exists() and (out_dir / "compare.png").exists()
    r = pyinfra("-y", INV, "deploy.py")  # leave the default stack serving
    assert r.rc == 0, r.output[-6000:]
