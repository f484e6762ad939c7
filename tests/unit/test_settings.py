"""sparkrig/config: a valid inventory becomes typed settings; every bad input, one clear message."""

from __future__ import annotations

import pytest
from pyinfra.api.exceptions import DeployError

from sparkrig.config.inventory import InventoryView, build
from tests.teststacks import register
from tests.unit.conftest import DIGEST, ROOT, cluster

STOCK = "vllm/vllm-openai:glm53-flash-arm64-cu130@sha256:" + "ab" * 32


def problems(view: InventoryView) -> str:
    with pytest.raises(DeployError) as err:
        build(view)
    return str(err.value)


def edit(view: InventoryView, group: str, index: int, **data) -> InventoryView:
    name, old = view.groups[group][index]
    view.groups[group][index] = (name, {**old, **data})
    return view


def test_valid_cluster_gets_ranks_in_inventory_order():
    settings = build(cluster(4))
    assert [settings[f"spark-{i}"].me.rank for i in range(4)] == [0, 1, 2, 3]
    worker = settings["spark-2"]
    assert worker.me.role == "worker" and worker.unit_name == "sparkrig-worker"
    assert [p.ip for p in worker.peers] == ["192.168.100.10"]
    assert [p.ip for p in settings["spark-0"].peers] == [f"192.168.100.1{i}" for i in (1, 2, 3)]
    assert str(worker.fabric_network) == "192.168.100.0/24"
    assert worker.knobs.profile == "shared" and not worker.needs_drafter


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda v: v.groups.update(head=[]),
            "group 'head' must hold exactly one host (rank 0), has none",
        ),
        (
            lambda v: v.groups["head"].append(("spark-x", dict(v.groups["head"][0][1]))),
            "group 'head' must hold exactly one host (rank 0), has spark-0, spark-x",
        ),
        (lambda v: v.groups.update(worker=[]), "group 'worker' must hold at least one host"),
        (
            lambda v: edit(v, "worker", 0, fabric_address=None),
            "spark-1: fabric_address: missing",
        ),
        (
            lambda v: edit(v, "worker", 0, fabric_interface=""),
            "spark-1: fabric_interface: missing",
        ),
        (
            lambda v: edit(v, "worker", 0, fabric_address="192.168.100.10/24"),
            "spark-1: fabric_address: 192.168.100.10 is already used by spark-0",
        ),
        (
            lambda v: edit(v, "worker", 0, fabric_address="192.168.101.11/24"),
            "spark-1: fabric_address: 192.168.101.11/24 is not on the head's fabric subnet",
        ),
        (
            lambda v: edit(v, "worker", 0, fabric_address="192.168.100.11"),
            "spark-1: fabric_address: '192.168.100.11' needs a prefix length",
        ),
        (
            lambda v: edit(v, "head", 0, fabric_mtu=65000),
            "spark-0: fabric_mtu: Input should be less",
        ),
        (
            lambda v: edit(v, "head", 0, fabric_mtu=576),
            "spark-0: fabric_mtu: Input should be greater",
        ),
        (
            lambda v: edit(v, "head", 0, nccl_smoke_bytes=16 * 2**30),  # froze a Spark (#102)
            "spark-0: nccl_smoke_bytes: Input should be less than or equal to 4294967296",
        ),
        (
            lambda v: edit(v, "head", 0, fabric_busbw_min_gbs=-1),
            "spark-0: fabric_busbw_min_gbs: Input should be greater than or equal to 0",
        ),
        (
            lambda v: edit(v, "head", 0, profile="turbo"),
            "spark-0: profile: Input should be 'single'",
        ),
        (
            lambda v: edit(v, "head", 0, model_revision="main"),
            "spark-0: model_revision: must be a 40-hex commit sha, not 'main'",
        ),
        (
            lambda v: edit(v, "head", 0, base_image="vllm/vllm-openai:latest"),
            "spark-0: base_image: must be pinned by digest",
        ),
        (
            lambda v: [edit(v, g, 0, base_image=STOCK) for g in ("head", "worker")],
            f"every host: base_image: {STOCK} is known not to work: the stock vLLM image",
        ),
        (
            lambda v: [
                edit(v, g, 0, base_image="docker.io/vllm/vllm-openai@sha256:" + "cd" * 32)
                for g in ("head", "worker")
            ],  # fmt: skip
            "(set base_image_known_bad_ok = True to use it anyway)",
        ),
        (
            lambda v: [
                edit(v, g, 0, watchdog=True, watchdog_grace_s=1800) for g in ("head", "worker")
            ],
            "every host: watchdog_grace_s: 1800 is below ready_timeout_s 3600",
        ),
        (
            lambda v: edit(v, "head", 0, watchdog_stall_s=60),
            "spark-0: watchdog_stall_s: 60 must exceed watchdog_interval_s 60",
        ),
        (
            lambda v: [edit(v, g, 0, gpu_clock_max_mhz=50) for g in ("head", "worker")],
            "every host: gpu_clock_max_mhz: Input should be greater than or equal to 100",
        ),
        (
            lambda v: edit(v, "worker", 0, gpu_clock_max_mhz=2400),
            "spark-1: gpu_clock_max_mhz: 2400 differs from spark-0's None",
        ),
        (
            lambda v: edit(v, "head", 0, api_auth=False, api_key_rotate=True),
            "spark-0: api_key_rotate: True with api_auth = False: an open API has no key",
        ),
        (
            lambda v: edit(v, "worker", 0, api_port=9000),
            "spark-1: api_port: 9000 differs from spark-0's 8000; it must be equal on every host",
        ),
        (
            lambda v: [edit(v, g, 0, profile="single") for g in ("head", "worker")],
            "profile: 'single' uses the drafter incoai/GLM-5.3-Flash-DFlash2 (CC BY-NC-ND 4.0",
        ),
        (
            lambda v: edit(v, "head", 0, container_gpu_args=["--gpus all"]),
            "spark-0: container_gpu_args: one argument per element",
        ),
        (
            lambda v: [edit(v, g, 0, engine_port=8000) for g in ("head", "worker")],
            "every host: api_port, engine_port, master_port (+1 for the smoke test), pair_port",
        ),
        (
            lambda v: edit(v, "head", 0, tls_cert="certs/api.pem"),
            "tls_cert is set alone: the front serves the operator's certificate with tls_cert",
        ),
        (
            lambda v: edit(v, "head", 0, tls_key="certs/api.key"),
            "tls_key is set alone",
        ),
        (
            lambda v: edit(v, "head", 0, tls_cert="c.pem", tls_key="k.pem", api_tls=False),
            "tls_cert is set while api_tls = False: the front serves plain HTTP then",
        ),
        (
            lambda v: edit(v, "head", 0, api_tls_names=["*.lab.example"]),
            "spark-0: api_tls_names: '*.lab.example' is neither a DNS name nor an IP address",
        ),
        (
            lambda v: edit(v, "head", 0, api_tls=False),
            "spark-1: api_tls: True differs from spark-0's False; it must be equal on every host",
        ),
        (
            lambda v: [
                edit(v, g, 0, api_cors_origins=["https://*.example.org"])
                for g in ("head", "worker")
            ],
            "is not an origin: scheme://host[:port], no path, no wildcard",
        ),
        (
            lambda v: [
                edit(v, g, 0, api_cors_origins=["https://app.example.org/"])
                for g in ("head", "worker")
            ],
            "is not an origin",
        ),
    ],
)
def test_bad_input_is_named_by_host_and_key(change, message):
    view = cluster(2)
    change(view)
    assert message in problems(view)


def test_every_problem_is_reported_at_once():
    view = cluster(3)
    edit(view, "worker", 0, fabric_address="192.168.100.10/24")
    edit(view, "worker", 1, profile="turbo")
    text = problems(view)
    assert "spark-1: fabric_address" in text and "spark-2: profile" in text


def test_single_profile_with_the_licence_accepted_needs_the_drafter():
    view = cluster(2, profile="single", drafter_license_accepted=True)
    assert build(view)["spark-1"].needs_drafter


def test_base_image_defaults_to_the_stacks_v11_digest_and_a_known_bad_one_needs_the_override():
    from tests.unit.conftest import knob_defaults

    v11 = "ghcr.io/tonyd2wild/vllm-glm53-flash@sha256:4def0ef644cb2e9814136dcffd5e385e21bc594f48f3b292234051904abe85a6"  # noqa: E501
    assert knob_defaults()["base_image"] is None  # None: the selected stack's pin
    assert build(cluster(2, base_image=None))["spark-1"].image_ref == v11
    assert knob_defaults()["base_image_known_bad_ok"] is False
    stock = STOCK
    view = cluster(2)
    for g in ("head", "worker"):
        edit(view, g, 0, base_image=stock, base_image_known_bad_ok=True)
    assert build(view)["spark-1"].image_ref == stock


# --- knobs: declared once, cluster-wide ones checked --------------------------------------------


def test_every_knob_has_its_default_once_in_all_py_with_a_comment():
    from sparkrig.config.knobs import Knobs

    text = (ROOT / "group_data/all.py").read_text().splitlines()
    for name, field in Knobs.model_fields.items():
        assert field.is_required(), f"{name}: a default in the model; group_data/all.py holds it"
        lines = [i for i, line in enumerate(text) if line.startswith(f"{name} = ")]
        assert len(lines) == 1, f"{name}: {len(lines)} assignments in group_data/all.py"
        # the comment is on the line or, for a wrapped value, on the line after
        assert "  # " in text[lines[0]] or "  # " in text[lines[0] + 1], f"{name}: no comment"


def test_a_knob_missing_from_group_data_is_an_error_not_a_silent_default(defaults):
    view = cluster(2)
    for group in ("head", "worker"):
        name, data = view.groups[group][0]
        view.groups[group][0] = (name, {k: v for k, v in data.items() if k != "pair_grace_s"})
    assert "every host: pair_grace_s: Field required" in problems(view)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("install_dir", "/opt/elsewhere"),
        ("config_dir", "/etc/elsewhere"),
        ("pair_token_file", ".sparkrig/other-token"),
        ("nccl_smoke_timeout_s", 600),
        ("nccl_smoke_bytes", 2**20),  # the ranks' collectives must match
        ("nccl_smoke_iters", 5),
        ("fabric_busbw_min_gbs", 16.0),
        ("image_transfer_dir", "/srv/images"),
        ("pair_grace_s", 60),
        ("weights_dir", "/srv/models"),
    ],
)
def test_cluster_wide_knobs_must_be_equal_on_every_host(key, value):
    from sparkrig.config.knobs import cluster_keys

    assert key in cluster_keys()
    view = edit(cluster(3), "worker", 1, **{key: value})
    assert f"spark-2: {key}: {value!r} differs from spark-0's" in problems(view)


def test_per_host_knobs_may_differ():
    view = edit(cluster(2), "worker", 0, container_memory="100g", roce_port=2)
    assert build(view)["spark-1"].knobs.container_memory == "100g"


# --- unknown keys: a misspelled knob is refused, pyinfra's own keys pass --------------------------


def test_a_misspelled_knob_is_refused_per_host_with_the_closest_known_name():
    view = edit(cluster(3), "worker", 1, profil="guard", watchdog_grace=10)
    text = problems(view)
    assert "spark-2: profil: unknown key; did you mean 'profile'?" in text
    assert "spark-2: watchdog_grace: unknown key; did you mean 'watchdog_grace_s'?" in text
    assert "spark-0: profil" not in text and "spark-1: profil" not in text


def test_a_key_like_no_known_one_is_refused_without_a_guess():
    text = problems(edit(cluster(2), "head", 0, zqxj=1))
    assert "spark-0: zqxj: unknown key: not a knob of group_data/all.py" in text
    assert "did you mean" not in text


def test_pyinfra_host_data_and_per_host_keys_are_not_knobs_but_pass():
    pyinfra_data = {
        "ssh_hostname": "10.0.0.1",
        "ssh_user": "ops",
        "ssh_key": "~/.ssh/id_ed25519",
        "ssh_port": 2222,
        "_sudo": True,
        "_sudo_user": "root",
        "_env": {"A": "1"},
        "_use_sudo_login": True,
        "fake_delay": 0,
        "docker_identifier": "x",
        "chroot_directory": "/mnt",
    }
    view = edit(cluster(2), "head", 0, roce_device="rocep1s0f1", api_url="https://h:8000")
    view = edit(view, "worker", 0, uplink_interfaces=["enP7s7"], **pyinfra_data)
    assert build(view)["spark-1"].me.address == "10.0.0.1"


def test_a_misspelled_pyinfra_key_is_refused_too():
    text = problems(edit(cluster(2), "worker", 0, ssh_usr="ops", _sudo_usr="root"))
    assert "spark-1: ssh_usr: unknown key; did you mean 'ssh_user'?" in text
    assert "spark-1: _sudo_usr: unknown key; did you mean '_sudo_user'?" in text


def test_the_retired_hf_token_file_says_where_the_token_comes_from_now():
    text = problems(edit(cluster(2), "head", 0, hf_token_file="~/.cache/huggingface/token"))
    assert "spark-0: hf_token_file: retired: the Hub token is the one huggingface_hub finds" in text


# --- the stack and its pins (docs/stacks.md) ------------------------------------------------


def other_stack(monkeypatch, **fields):
    return register(monkeypatch, "test-other", **fields)


def test_the_stack_knob_defaults_to_vllm_nvfp4_and_resolves_its_pins():
    s = build(cluster(2, base_image=None))["spark-1"]
    assert s.knobs.stack == "vllm-nvfp4" and s.stack.name == "vllm-nvfp4"
    assert s.image_ref == s.stack.image
    assert (s.model.repo, s.model.revision) == (
        "LibertAIDAI/GLM-5.3-Flash-NVFP4",
        "caca4e6a4ebbd66f159d3d2fc256683fd6e27177",
    )
    assert s.drafter is not None and s.drafter.revision.startswith("7d74cdd8")
    assert s.locked_artifacts == [("model", s.model.repo, s.model.revision)]


def test_an_unknown_stack_is_refused_naming_the_declared_ones():
    from sparkrig.stacks import STACKS

    text = problems(cluster(2, stack="vllm-fp8"))
    assert "every host: stack: unknown stack 'vllm-fp8'; choose one of " in text
    assert all(name in text for name in STACKS)
    assert "profile" not in text  # profile None is the stack's own: no second, misleading error


def test_the_stack_must_be_the_same_on_every_host(monkeypatch):
    other_stack(monkeypatch)
    view = cluster(2, base_image=None)
    edit(view, "worker", 0, stack="test-other")
    assert "spark-1: stack: 'test-other' differs from spark-0's 'vllm-nvfp4'" in problems(view)


@pytest.mark.parametrize(
    ("pins", "message"),
    [
        ({"no-such-stack": {}}, "stack_pins: ['no-such-stack']: unknown stack; choose among"),
        ({"vllm-nvfp4": {"image": "x"}}, "['vllm-nvfp4']['image']: unknown pin; the keys are "),
        (
            {"vllm-nvfp4": {"base_image": "ghcr.io/x/y:latest"}},
            "['vllm-nvfp4']['base_image']: must be pinned by digest",
        ),
        (
            {"vllm-nvfp4": {"model_revision": "main"}},
            "['vllm-nvfp4']['model_revision']: must be a 40-hex commit sha, not 'main'",
        ),
        (
            {"vllm-nvfp4": {"drafter_repo": "no-owner"}},
            "['vllm-nvfp4']['drafter_repo']: must be a Hub repository (owner/name)",
        ),
    ],
)
def test_stack_pins_are_validated(pins, message):
    assert message in problems(cluster(2, stack_pins=pins))


def test_pins_precedence_knob_over_stack_pins_over_the_declaration(monkeypatch):
    stack = other_stack(monkeypatch)
    pinned_image = "registry.example/pinned@sha256:" + "ef" * 32
    knob_image = "registry.example/knob@sha256:" + "12" * 32
    pins = {"test-other": {"base_image": pinned_image, "model_revision": "3" * 40}}
    # the declaration alone
    s = build(cluster(2, base_image=None, stack="test-other"))["spark-0"]
    assert (s.image_ref, s.model.revision) == (stack.image, "1" * 40)
    # stack_pins of the selected stack over it; another stack's pins change nothing
    s = build(cluster(2, base_image=None, stack="test-other", stack_pins=pins))["spark-0"]
    assert (s.image_ref, s.model.revision, s.model.repo) == (
        pinned_image,
        "3" * 40,
        "example/other-model",
    )
    s = build(cluster(2, base_image=None, stack_pins=pins))["spark-0"]  # vllm-nvfp4 selected
    assert s.image_ref != pinned_image and s.model.revision.startswith("caca4e6a")
    # a top-level knob over both
    view = cluster(2, base_image=knob_image, stack="test-other", stack_pins=pins)
    s = build(view)["spark-0"]
    assert s.image_ref == knob_image and s.model.revision == "3" * 40


def test_a_stack_with_no_image_is_refused_before_any_host_naming_why(monkeypatch):
    other_stack(monkeypatch, image=None, image_note="no published image: build the v8 chain")
    text = problems(cluster(2, base_image=None, stack="test-other"))
    assert "every host: base_image: missing: stack 'test-other' declares no image" in text
    assert "no published image: build the v8 chain" in text
    assert "stack_pins['test-other']['base_image']" in text
    pins = {"test-other": {"base_image": DIGEST}}
    assert build(cluster(2, base_image=None, stack="test-other", stack_pins=pins))


def test_a_profile_the_stack_does_not_serve_is_refused(monkeypatch):
    stack = other_stack(monkeypatch)
    only_single = {"single": stack.profiles["single"]}
    other_stack(monkeypatch, profiles=only_single, default_profile="")
    text = problems(cluster(2, stack="test-other", profile="shared"))
    assert "profile: stack 'test-other' serves no profile 'shared'; choose one of single" in text


def test_profile_none_serves_the_stacks_own_profile(monkeypatch):
    """`--data stack=<name>` alone switches: the default profile None is the stack's own."""
    s = build(cluster(2, profile=None))["spark-1"]
    assert s.knobs.profile == "shared"  # vllm-nvfp4's declared default
    stack = other_stack(monkeypatch)
    other_stack(monkeypatch, profiles={"single": stack.profiles["single"]}, default_profile="")
    s = build(cluster(2, stack="test-other", profile=None, drafter_license_accepted=True))
    assert s["spark-1"].knobs.profile == "single"  # its one profile


def test_a_stacks_memory_gate_reaches_the_start_gate_and_needs_a_floor(monkeypatch):
    from sparkrig.serving import memory_gate_args
    from sparkrig.stacks.base import MemoryGate

    s = build(cluster(2))["spark-1"]
    assert "--memory-measure" not in memory_gate_args(s)  # vllm-nvfp4: MemFree, derived floor
    assert "--memfree-min-gib" not in memory_gate_args(s)
    other_stack(monkeypatch, memory=MemoryGate("used", 6.0, "Entrpi's 6 GB preflight"))
    args = memory_gate_args(build(cluster(2, stack="test-other"))["spark-1"])
    assert "--memfree-min-gib 6 --memory-measure used" in args
    # memfree_min_gib is a free-memory floor: it never becomes a used-memory ceiling (the lab's
    # 0.2 GiB floor did, and refused every start of entrpi-exl3 with 0.3 GiB used)
    args = memory_gate_args(build(cluster(2, stack="test-other", memfree_min_gib=0.2))["spark-1"])
    assert "--memfree-min-gib 6 --memory-measure used" in args
    other_stack(monkeypatch, memory=MemoryGate("available", 100.0))
    args = memory_gate_args(build(cluster(2, stack="test-other", memfree_min_gib=5))["spark-1"])
    assert "--memfree-min-gib 5 --memory-measure available" in args  # a floor: the knob wins
    other_stack(monkeypatch, memory=MemoryGate("available", None))
    assert "stack 'test-other''s start gate measures 'available' memory and declares no floor" in (
        problems(cluster(2, stack="test-other"))
    )


def test_a_stacks_caches_env_and_flags_reach_the_rank(monkeypatch):
    from sparkrig.fabric import env_context
    from sparkrig.render import render
    from sparkrig.serving import docker_run_args, rank_serve_args

    other_stack(
        monkeypatch,
        caches={"/jit-cache": "every JIT cache", "/root/.triton": "triton"},
        env={"GLM53_TEST": "1"},
        serve_flags=("--linear-backend", "marlin"),
        head_flags=("--chat-template", "/chat_template.jinja"),
    )
    settings = build(cluster(2, stack="test-other"))
    head, worker = settings["spark-0"], settings["spark-1"]
    run = docker_run_args(worker, "img@sha256:" + "ab" * 32)
    volumes = {run[i + 1] for i, word in enumerate(run) if word == "--volume"}
    base = "/var/lib/sparkrig/cache/img_sha256_" + "ab" * 32
    assert {f"{base}/jit-cache:/jit-cache", f"{base}/root_.triton:/root/.triton"} <= volumes
    assert not any(v.endswith(":/root/.cache") for v in volumes)
    env = render("rank.env.j2", **env_context(worker), hca="rocep1s0f1", gid_index="3")
    # after sparkrig's own lines, which every stack gets
    assert env.index("VLLM_ENGINE_READY_TIMEOUT_S=3600") < env.index("\nGLM53_TEST=1\n")
    assert "--linear-backend" in rank_serve_args(worker)
    assert "--chat-template" in rank_serve_args(head)
    assert "--chat-template" not in rank_serve_args(worker)  # head_flags: rank 0 alone


def test_front_knobs_accept_origins_and_a_tls_pair():
    view = cluster(2)
    for g in ("head", "worker"):
        edit(view, g, 0, api_cors_origins=["https://app.example.org", "http://[::1]:3000"])
    edit(view, "head", 0, tls_cert="certs/api.pem", tls_key="certs/api.key")
    settings = build(view)
    assert settings["spark-0"].knobs.tls_key == "certs/api.key"


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("install_dir", "/opt/x$(touch /tmp/pwn)"),
        ("config_dir", "/etc/spark rig"),
        ("weights_dir", "/var/lib/'models"),
        ("cache_dir", "/var/cache/../etc"),
        ("install_dir", "/opt/x\nExecStartPre=/bin/true"),
    ],
)
def test_a_path_knob_with_shell_or_unit_syntax_is_refused(knob, value):
    """Issue 48: the path knobs land in unit files and shell commands; one that could inject
    is refused by name before any host is touched."""
    with pytest.raises(DeployError, match=knob):
        build(cluster(**{knob: value}))


def test_an_extra_serve_arg_with_a_newline_is_refused():
    """A newline would end the rank unit's ExecStart and start a line of its own."""
    with pytest.raises(DeployError, match="control character"):
        build(cluster(extra_serve_args=["--foo", "bar\nExecStartPost=/bin/sh"]))
    build(cluster(extra_serve_args=["--max-num-seqs", "8"]))


def test_a_problem_of_every_host_is_said_once_and_one_of_a_host_names_it():
    """Issue 49: group_data and --data apply to every host; their refusal is one line, not one
    per host; a problem of one host still names it."""
    from sparkrig.config.inventory import said_once

    hosts = ["spark-0", "spark-1"]
    got = said_once(["spark-0: profil: unknown key", "spark-1: profil: unknown key",
                     "spark-1: api_port: 9000 differs", "inventory: no worker"], hosts)  # fmt: skip
    assert got == ["every host: profil: unknown key", "spark-1: api_port: 9000 differs",
                   "inventory: no worker"]  # fmt: skip
    assert said_once(["spark-0: x"], ["spark-0"]) == ["spark-0: x"]
