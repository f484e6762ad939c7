"""Every stack declaration is well formed: its image pinned by digest (or None with a note that
names the chain and the way out), its weights at 40-hex commits, every commit and digest it names
written down in the fact docs (never invented), its figures with sources, its fork-only pieces
equal to the test data's, and every variable its recipe sets either carried (rank.env or the
stack's env) or left out for a stated reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from stack_helpers import DECLARED, MODULES, RECIPES, REPO, fork_only

from sparkrig.config.checks import COMMIT_RE, DIGEST_REF_RE
from sparkrig.profiles import flag_value
from sparkrig.stacks.base import Stack

STACKS = list(DECLARED.values())
IDS = list(DECLARED)
FACT_DOCS = (REPO / "docs" / "stacks-facts.md", REPO / "docs" / "stacks.md")
# protocols a Figure may name: sparkrig.bench's (seed000, seed004) and the publishers' own, which
# docs/stacks.md describes (shown beside the stack's results, not re-measured by sparkrig)
PROTOCOLS = {"seed000", "seed004", "entrpi-workloads", "miaai"}
HEX = re.compile(r"\b[0-9a-f]{40}\b|\b[0-9a-f]{64}\b")


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_the_module_is_named_for_the_stack(stack: Stack) -> None:
    assert Path(MODULES[stack.name].__file__ or "").stem == stack.name.replace("-", "_")


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_image_is_pinned_by_digest_or_none_with_the_way_out(stack: Stack) -> None:
    if stack.image is not None:
        assert DIGEST_REF_RE.match(stack.image), stack.image
        assert stack.image_note
        return
    note = stack.image_note
    # the refusal settings give must name the chain, why it cannot be built, and the knobs
    for words in ("v8", "v13", "patch_v7.py", "network", "base_image", "stack_pins"):
        assert words in note, f"image_note lacks {words!r}"


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_weights_are_pinned_at_commits_with_a_reason(stack: Stack) -> None:
    pins = [stack.model] + ([stack.drafter] if stack.drafter else [])
    for pin in pins:
        assert COMMIT_RE.match(pin.revision), pin
        assert "/" in pin.repo and pin.why, pin
    if stack.drafter:
        assert "CC BY-NC-ND" in stack.drafter.license_note  # the licence knob gates it


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_every_commit_and_digest_is_written_down_in_the_fact_docs(stack: Stack) -> None:
    """A full commit or digest in a declaration is one the fact sheet or docs/stacks.md records
    with its source: none is invented."""
    facts = "".join(p.read_text() for p in FACT_DOCS if p.exists())
    source = Path(MODULES[stack.name].__file__ or "").read_text()
    named = set(HEX.findall(source))
    assert named, "a declaration names its pins in full"
    missing = sorted(h for h in named if h not in facts)
    assert not missing, f"not in docs/stacks-facts.md or docs/stacks.md: {missing}"


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_figures_have_protocols_and_sources(stack: Stack) -> None:
    assert stack.figures
    for fig in stack.figures:
        assert fig.value > 0 and fig.unit in ("tok/s", "s", "tokens", "share"), fig
        assert fig.unit != "share" or fig.high <= 1, fig  # a share of draft tokens
        assert fig.protocol in PROTOCOLS, fig
        assert fig.source in stack.sources, fig
    keys = [(f.name, f.protocol, f.profile) for f in stack.figures]
    assert len(keys) == len(set(keys)), "one figure per name, protocol and profile"


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_fork_only_pieces_equal_the_test_data(stack: Stack) -> None:
    data = fork_only(stack)
    assert set(stack.fork_flags) == set(data["flags"]) | set(data["values"])
    assert set(stack.fork_env) == set(data["env"])
    assert all(data[k][name] for k in data for name in data[k]), "every entry has its source"
    argv = list(stack.serve_flags) + list(stack.head_flags)
    for item in data["values"]:  # a fork-only value the stack does not pass is not its own
        flag, value = item.split("=", 1)
        assert flag_value(argv, flag) == value, item


def rank_env_names() -> set[str]:
    text = (REPO / "templates" / "rank.env.j2").read_text()
    return set(re.findall(r"^([A-Z][A-Z0-9_]*)=", text, re.MULTILINE))


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_every_recipe_variable_is_carried_or_left_out_for_a_reason(stack: Stack) -> None:
    recipe = {k: v for k, v in RECIPES[stack.name]["recipe_env"].items() if k != "_source"}
    rank_env = rank_env_names()
    for name, where in recipe.items():
        if where.startswith("rank.env"):
            assert name in rank_env and name not in stack.env, name
        elif where == "stack":
            assert name in stack.env and name not in rank_env, name
        else:
            assert where.startswith("not carried: ") and name not in stack.env, name
    extra = set(stack.env) - set(recipe)
    assert not extra, f"env the recipe does not set: {sorted(extra)}"


def test_entrpi_sets_no_update_check_variable_nothing_reads() -> None:
    """GLM53_NO_UPDATE_CHECK is the host launcher's switch (facts §0.4): sparkrig leaves it out,
    and its docstring says why."""
    stack = DECLARED["entrpi-exl3"]
    assert "GLM53_NO_UPDATE_CHECK" not in stack.env
    assert "kit_update_check()" in (MODULES["entrpi-exl3"].__doc__ or "")


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_speculation_is_profile_single_and_equals_the_recipe(stack: Stack) -> None:
    """The adapter takes the speculative config (with sparkrig's drafter directory) from the
    stack's profile; it must be the recipe's method and token count."""
    spec = RECIPES[stack.name]["speculative"]
    assert tuple(stack.profiles) == ("single",)
    p = stack.profile("single")
    assert (p.speculative, p.num_speculative_tokens) == (
        spec["method"],
        spec["num_speculative_tokens"],
    )
    assert "--speculative-config" not in stack.serve_flags + stack.head_flags


def test_sfxnz_capture_sizes_follow_run_sh_rule() -> None:
    stack = DECLARED["sfxnz-v13"]
    k = RECIPES["sfxnz-v13"]["speculative"]["num_speculative_tokens"]
    seqs = int(flag_value(stack.serve_flags, "--max-num-seqs") or 0)
    config = json.loads(flag_value(stack.serve_flags, "--compilation-config") or "{}")
    assert config["cudagraph_capture_sizes"] == [1, 2, 4] + [
        (k + 1) * i for i in range(1, seqs + 1)
    ]


def test_entrpi_memory_gate_is_the_launchers_used_preflight() -> None:
    gate = DECLARED["entrpi-exl3"].memory
    assert (gate.measure, gate.floor_gib) == ("used", 6.0) and gate.source


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_a_measured_floor_is_given_where_the_gate_is_not_sparkrigs_own(stack: Stack) -> None:
    if stack.memory.measure != "memfree":
        assert stack.memory.floor_gib is not None and stack.memory.floor_gib > 0
    assert stack.memory.source


def readme_rows() -> dict[str, str]:
    text = (REPO / "README.md").read_text().split("\n## Stacks\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([a-z0-9-]+)` \|(.*)$", text, re.MULTILINE))


def test_the_readme_stacks_table_has_its_columns_and_a_row_per_declared_stack() -> None:
    from sparkrig.stacks import STACKS as ALL

    text = (REPO / "README.md").read_text().split("\n## Stacks\n", 1)[1].split("\n## ", 1)[0]
    header = (
        "| stack | engine | recipe: image; weights; drafter | pick it for | needs "
        "| a switch downloads | published figures, tok/s (source) |"
    )
    assert header in text
    for name in ALL:
        assert re.search(rf"^\| `{re.escape(name)}`", text, re.MULTILINE), name


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_the_readme_stacks_table_shows_the_declaration(stack: Stack) -> None:
    """The README's row names the stack's image digest (or says there is none), its pins and
    at least one of its figures with the figure's source."""
    row = readme_rows()[stack.name]
    if stack.image:
        assert stack.image.split("@sha256:")[1][:8] in row
    else:
        assert "none published" in row
    for pin in [stack.model] + ([stack.drafter] if stack.drafter else []):
        assert f"{pin.repo}@{pin.revision[:8]}" in row, pin
    assert any(f"{f.value:,g}" in row for f in stack.figures)
    assert any(f.source.split(" (")[0].removeprefix("Entrpi ") in row for f in stack.figures)


def docs_section(name: str) -> str:
    text = (REPO / "docs" / "stacks.md").read_text()
    return text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("stack", STACKS, ids=IDS)
def test_the_docs_section_gives_each_pins_lockfile_command(stack: Stack) -> None:
    section = docs_section(stack.name)
    for pin in [stack.model] + ([stack.drafter] if stack.drafter else []):
        command = f"refresh --repo {pin.repo} \\\n  --revision {pin.revision} "
        assert command in section, pin
