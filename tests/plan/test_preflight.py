"""Preflight of a first deploy (issue 32): every refusal comes before any host changes and says
its figures and its next step: too little disk for what the lockfiles still have to fetch, a
port sparkrig needs held by another program, the head unable to reach the Hub or the image
registry when it must download from them (and never asked when nothing must be downloaded),
sudo refusing the deploy's first command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sparkrig.factlines import END
from tests.image.fakeimage import image_state
from tests.plan import fakehosts
from tests.plan.harness import SUDO_REFUSES
from tests.plan.test_plan import HEAD, WORKER, apply, converge_state, refused_before_any_change

GIB = 1024**3
LOCKS = Path("tests/plan/locks")
MODEL_LOCK = "LibertAIDAI--GLM-5.3-Flash-NVFP4.lock.json"


def big_locks(tmp: Path, model_gib: float) -> str:
    """A copy of the plan tests' lockfiles whose model weighs ``model_gib`` GiB."""
    for lock in LOCKS.glob("*.lock.json"):
        shutil.copy(lock, tmp / lock.name)
    data = json.loads((LOCKS / MODEL_LOCK).read_text())
    for entry in data["files"]:
        if entry["path"].endswith(".safetensors"):
            entry["size"] = int(model_gib * GIB)
    (tmp / MODEL_LOCK).write_text(json.dumps(data))
    return str(tmp)


def disk_free(short: str, free_gib: float) -> None:
    fakehosts.inject(short, {fakehosts.NODE: fakehosts.node_report(disk_free=int(free_gib * GIB))})


def test_a_first_deploy_needs_the_lockfiles_size_and_the_space_kept_free(monkeypatch, tmp_path):
    locks = big_locks(tmp_path, 181)
    disk_free("spark-b", 200)
    r = apply(monkeypatch, "--data", f"lockfile_dir={locks}")
    refused_before_any_change(
        r,
        f"200.0 GiB free under /var/lib/sparkrig/models, need 245.0 GiB: 181.0 GiB of weights "
        f"still to fetch (the lockfiles in {locks}) + 64 GiB kept free (min_disk_free_gib)",
    )


def test_a_first_deploy_with_the_room_it_needs_goes_ahead(monkeypatch, tmp_path):
    locks = big_locks(tmp_path, 181)
    disk_free("spark-b", 246)
    r = apply(monkeypatch, "--dry", "--data", f"lockfile_dir={locks}")
    assert r.exit_code == 0, r.output
    assert "GiB free under" not in r.output


def test_verified_files_need_no_room_only_what_is_left_to_fetch(monkeypatch):
    converge_state()
    s = fakehosts.settings_of("tests/plan/inventory_state.py")[WORKER]
    half = {"ok": True, "commit": s.model.revision, "total_files": 2, "verified": 1,
            "missing": 1, "files_to_fetch": 1, "bytes_to_fetch": 90 * GIB}  # fmt: skip
    fakehosts.inject("spark-b", {fakehosts.WEIGHTS_STATE: json.dumps(half)})
    disk_free("spark-b", 150)  # 90 + 64 > 150
    r = apply(monkeypatch)
    refused_before_any_change(r, "150.0 GiB free under /var/lib/sparkrig/models, need 154.0 GiB: "
                                 "90.0 GiB of weights still to fetch")  # fmt: skip


@pytest.mark.parametrize(
    ("short", "held", "message"),
    [
        (
            "spark-a",
            fakehosts.listening(8000, "node", 777, container="open-webui"),
            "port 8000 (api_port) is held by node (pid 777, docker container open-webui) on "
            "*:8000; stop that program, or set api_port to a port free on every node",
        ),
        (
            "spark-b",
            fakehosts.listening(29600, "beacond", 4321, unit="beacond.service", address="0.0.0.0"),
            "port 29600 (pair_port) is held by beacond (pid 4321, beacond.service) on "
            "0.0.0.0:29600; stop that program, or set pair_port to a port free on every node",
        ),
    ],
    ids=["api-port-by-a-container", "pair-port-by-a-unit"],
)
def test_a_port_held_by_another_program_is_refused_naming_the_knob(
    monkeypatch, short, held, message
):
    fakehosts.inject(short, {fakehosts.PORTS: [held, END]})
    refused_before_any_change(apply(monkeypatch), message)


def test_a_port_held_by_sparkrigs_own_unit_is_no_refusal(monkeypatch):
    """A copy server left by an interrupted run holds copy_port: sparkrig's, so not refused."""
    held = fakehosts.listening(29700, "python3", 555, unit="sparkrig-weights-serve.service")
    fakehosts.inject("spark-a", {fakehosts.PORTS: [held, END]})
    r = apply(monkeypatch, "--dry")
    assert r.exit_code == 0, r.output
    assert "is held by" not in r.output


DNS = "[Errno -3] Temporary failure in name resolution"


def reach_commands(r) -> list[str]:
    return [c for c in r.commands.get(HEAD, []) if fakehosts.REACH.search(c)]


@pytest.mark.parametrize(
    ("reached", "message"),
    [
        (
            {"hub": DNS},
            f"the head does not reach {fakehosts.HUB_API} ({DNS}) and must download the weights "
            "from the Hub (hub_endpoint https://huggingface.co;",
        ),
        (
            {"registry": "timed out"},
            f"the head does not reach {fakehosts.REGISTRY_API} (timed out) and must download the "
            "base image registry.example/vllm from its registry",
        ),
        (
            {"archive": DNS},
            f"the head does not reach {fakehosts.ARCHIVE} ({DNS}) and must download nginx, the "
            "API front, from its package archive",
        ),
    ],
    ids=["hub", "registry", "archive"],
)
def test_a_first_deploy_the_head_cannot_download_for_is_refused(monkeypatch, reached, message):
    fakehosts.inject("spark-a", {fakehosts.REACH: fakehosts.reached(**reached)})
    r = apply(monkeypatch)
    refused_before_any_change(r, message)
    assert "check the head's DNS, route and firewall" in r.output


def test_a_converged_pair_never_asks_for_the_internet(monkeypatch):
    converge_state()
    fakehosts.inject("spark-a", {fakehosts.REACH: fakehosts.reached(hub=DNS, registry=DNS)})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert reach_commands(r) == []


def test_the_head_asks_only_for_what_it_must_download(monkeypatch):
    """Weights verified, the base image gone: the registry is asked, the Hub is not."""
    converge_state()
    bare_image = image_state(fakehosts.IMAGE, pulled=False, base=False, patched=False)
    fakehosts.inject("spark-a", {fakehosts.IMAGE_FACT: bare_image})
    r = apply(monkeypatch, "--dry")
    assert r.exit_code == 0, r.output
    (asked,) = reach_commands(r)
    assert fakehosts.REGISTRY_API in asked and fakehosts.HUB_API not in asked


@pytest.mark.parametrize(
    ("stderr", "message"),
    [
        (
            ["sudo: a password is required"],
            "sudo asks this user for a password and got none (sudo: a password is required): "
            "type it when pyinfra asks `sudo password:` at the first command",
        ),
        (
            ["Sorry, try again.", "sudo: 3 incorrect password attempts"],
            "sudo refused the password typed at pyinfra's `sudo password:` prompt",
        ),
        (
            ["sudo: a terminal is required to read the password"],
            "check that SSH logs in (`ssh <host> true`), that sudo runs without a prompt",
        ),
    ],
    ids=["no-password", "wrong-password", "other"],
)
def test_sudo_refusing_the_first_command_says_why_and_what_to_do(monkeypatch, stderr, message):
    fakehosts.inject("spark-b", {SUDO_REFUSES: stderr})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    shown = str(getattr(r.exception, "exception", r.exception))
    assert shown.startswith(f"{WORKER}: ") and message in shown, shown
    assert "\n" not in shown and "Traceback" not in r.output
    if "password" in message:
        assert "--same-sudo-password" in shown or "NOPASSWD" in shown
    assert r.commands[WORKER] and all("##SPARKRIG-PART" in c for c in r.commands[WORKER])
    assert all("##SPARKRIG-PART" in c for c in r.commands[HEAD]), "the head went on"


def test_each_node_says_what_it_still_has_to_fetch(monkeypatch, tmp_path):
    r = apply(monkeypatch, "--dry", "--data", f"lockfile_dir={big_locks(tmp_path, 181)}")
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        assert f"[{name}] weights still to fetch: model 181.0 GiB" in r.output


def test_a_stack_switch_needs_the_new_stacks_lockfiles_beside_the_serving_stacks_weights(
    monkeypatch, tmp_path
):
    """Switching stacks: the serving stack's weights stay on the disk (free space already counts
    them) and the new stack's lockfile must fit beside them; the refusal names both."""
    from tests import teststacks

    locks = big_locks(tmp_path, 181)  # the serving stack's, and the new stack's below
    other = json.loads((tmp_path / MODEL_LOCK).read_text())
    other.update(repo="example/other-model", commit="1" * 40, revision="1" * 40)
    # the name lockfiles had before stacks (Name.lock.json): still read when it is this repo's
    (tmp_path / "other-model.lock.json").write_text(json.dumps(other))
    teststacks.register(monkeypatch, "test-other", drafter=None)
    converge_state()
    disk_free("spark-b", 200)
    r = apply(
        monkeypatch, "--data", f"lockfile_dir={locks}", "--data", "stack=test-other",
        "--data", "reach_check=False",  # the fakes answer no Hub for the new model
    )  # fmt: skip
    refused_before_any_change(
        r,
        "200.0 GiB free under /var/lib/sparkrig/models, need 245.0 GiB: 181.0 GiB of weights "
        f"still to fetch (the lockfiles in {locks}) + 64 GiB kept free (min_disk_free_gib); "
        "the serving release (stack vllm-nvfp4, image ",
    )
    assert "keeps its weights there until the new one passes its gates" in r.output


def stack_with_a_file(monkeypatch) -> tuple[str, ...]:
    """A test-only stack (vllm-nvfp4's pins, so the plan tests' lockfiles fit) that declares
    sfxnz-v13's head-only chat template; the ``--data`` selecting it."""
    from sparkrig.stacks.sfxnz_v13 import CHAT_TEMPLATE
    from sparkrig.stacks.vllm_nvfp4 import STACK as NVFP4
    from tests import teststacks

    flags = ("--chat-template", CHAT_TEMPLATE.container_path)
    teststacks.register(monkeypatch, "test-files", model=NVFP4.model, drafter=NVFP4.drafter,
                        files=(CHAT_TEMPLATE,), head_flags=flags)  # fmt: skip
    return ("--data", "stack=test-files")


def test_the_head_fetches_the_stacks_file_after_reaching_it_and_no_worker_does(monkeypatch):
    from sparkrig.stacks.sfxnz_v13 import CHAT_TEMPLATE

    url = CHAT_TEMPLATE.url
    fakehosts.inject(
        "spark-a", {fakehosts.REACH: [*fakehosts.reached()[:-1], f"ok {url} 200", END]}
    )
    r = apply(monkeypatch, *stack_with_a_file(monkeypatch))
    assert r.exit_code == 0, r.output[-3000:]
    (asked,) = reach_commands(r)
    assert url in asked  # preflight asked the head's reach of the file's URL
    dest = f"/opt/sparkrig/stack-files/{CHAT_TEMPLATE.commit}/chat_template.jinja"
    fetched = [c for c in r.commands[HEAD] if url in c and "urllib" in c and dest in c]
    assert len(fetched) == 1
    assert not [c for c in r.commands[WORKER] if url in c or dest in c]  # no other rank gets it
    unit = r.uploads[HEAD]["/etc/systemd/system/sparkrig-head.service"].decode()
    assert f"{dest}:/chat_template.jinja:ro" in unit and "--chat-template" in unit
    worker_unit = r.uploads[WORKER]["/etc/systemd/system/sparkrig-worker.service"].decode()
    assert "chat_template" not in worker_unit


def test_a_head_that_cannot_reach_the_stacks_file_is_refused_before_any_change(monkeypatch):
    from sparkrig.stacks.sfxnz_v13 import CHAT_TEMPLATE

    url = CHAT_TEMPLATE.url
    fakehosts.inject("spark-a", {fakehosts.REACH: [*fakehosts.reached()[:-1], f"fail {url} {DNS}",
                                                   END]})  # fmt: skip
    r = apply(monkeypatch, *stack_with_a_file(monkeypatch))
    refused_before_any_change(
        r, f"the head does not reach {url} ({DNS}) and must download the stack"
    )  # fmt: skip
    assert "file chat_template.jinja (sfxnz/GLM-5.3-Flash-NVFP4-vLLM-2x-DGX-Spark@f59cb7cc" in (
        r.output
    )


def test_ranks_clocks_120_s_apart_are_refused_on_every_rank_naming_the_skew(monkeypatch):
    """Issue 47: the helpers refuse a signed call more than 30 s old, so an ordered restart
    between ranks 120 s apart would leave the pair down; preflight names both and the fix."""
    converge_state()
    fakehosts.inject("spark-b", {fakehosts.CLOCK: "120"})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    said = f"clocks: {WORKER} is 120 s ahead of {HEAD}"
    assert said in r.output and "timedatectl set-ntp true" in r.output
    refused = [c for cmds in r.commands.values() for c in cmds if c.endswith(">&2; exit 1")]
    assert len(refused) == 2 and all(said in c for c in refused)
    for name in (HEAD, WORKER):
        assert r.uploads.get(name, {}) == {}, f"{name} was changed"


def test_ranks_clocks_a_few_seconds_apart_pass(monkeypatch):
    converge_state()
    fakehosts.inject("spark-b", {fakehosts.CLOCK: "-9"})
    r = apply(monkeypatch, "--dry")
    assert r.exit_code == 0, r.output
    assert "clocks:" not in r.output
