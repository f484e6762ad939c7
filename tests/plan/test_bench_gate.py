"""Upgrades gated on the bench's figures (sparkrig/benchgate.py), planned through the real CLI on
@fake hosts: a changed release is promoted only when the short bench (run from the control
machine, here tests/plan/fakebench.py's canned results) reaches 1 - bench_tolerance of the
previous release's recorded figures; otherwise the rollback runs and the run names both figures.
The first release's figures become the baseline; bench_gate = False skips the bench; --dry and a
run whose release does not change never run it."""

from __future__ import annotations

import pytest

from sparkrig.release import Release
from tests.plan import fakebench, fakehosts
from tests.plan.test_plan import HEAD, INVENTORY, WORKER, apply, converge_state, run, settings
from tests.plan.test_release import UPGRADE, uploaded_record

PREVIOUS = {"single_stream_tok_s": 30.0, "decode_tok_s.4": 80.0, "tool_call_ok": True,
            "fffd_per_10k_chars": 0.0, "fffd_chars": 3000}  # fmt: skip
RUNS = 3  # bench_gate_runs' default: the canned result answers each run


def kept(single: float = 30.0, four: float = 80.0) -> dict[str, object]:
    """What a release whose every run measured ``single`` and ``four`` keeps: the medians, the
    p10s, the runs, the corruption probe over the three answers."""
    return {**PREVIOUS, "single_stream_tok_s": single, "decode_tok_s.4": four,
            "single_stream_tok_s.p10": single, "decode_tok_s.4.p10": four, "runs": RUNS,
            "fffd_chars": RUNS * 3000}  # fmt: skip


def converge_with_figures(figures: dict[str, object] | None = PREVIOUS) -> None:
    """A converged pair whose serving release records ``figures`` (None: none, a record from
    before the gate) on every rank."""
    converge_state()
    for name in settings():
        fakehosts.serving_recorded(name.split("/")[1], bench=tuple(sorted((figures or {}).items())))


def bench_of(release: Release) -> dict[str, object]:
    return dict(release.bench)


@pytest.mark.parametrize("single, four", [(30.0, 80.0), (27.5, 72.5), (33.0, 90.0)])
def test_an_upgrade_at_or_above_the_floor_is_promoted_with_its_figures(monkeypatch, single, four):
    """Equal, just above 90% of (27.5 >= 27.0, 72.5 >= 72.0) and faster than the previous
    release: promoted, and its own figures are recorded with it on every rank."""
    converge_with_figures()
    fakebench.answer(fakebench.result(single=single, four=four))
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code == 0, r.output[-3000:]
    assert len(fakebench.CALLS) == RUNS
    assert fakebench.CALLS[0].model == "glm-5.3-flash" and fakebench.CALLS[0].profile == "long"
    for name in (HEAD, WORKER):
        record = uploaded_record(r, name)
        assert [x.profile for x in record] == ["long", "shared"]
        assert bench_of(record[0]) == kept(single, four)
        assert bench_of(record[1]) == PREVIOUS  # the previous release keeps its own
    assert (
        f"short bench: single-stream decode {single:.2f} tok/s (p10 {single:.2f} of 3 runs)"
        in r.output
    )
    assert "no drafter in this release: the acceptance floor is not held" in r.output
    assert "previous release: single-stream decode 30.00 tok/s" in r.output


def test_a_slower_upgrade_is_rolled_back_naming_both_figures(monkeypatch):
    """30% slower (the lab's slow variant's factor): below 90% of both speeds."""
    converge_with_figures()
    fakebench.answer(fakebench.result(single=21.0, four=56.0))
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code != 0
    said = (
        "short bench below 90% of the previous release (bench_tolerance 0.1): single-stream "
        "decode 21.00 tok/s is below 90% of the previous release's 30.00 tok/s (floor 27.00); "
        "4-stream aggregate decode 56.00 tok/s is below 90% of the previous release's 80.00 "
        "tok/s (floor 72.00)"
    )
    assert said in r.output, r.output[-3000:]
    assert "upgrade failed (" in r.output and "): bench: " in r.output
    assert "profile shared) passed the four gates and serves again" in r.output
    for name, cmds in r.commands.items():
        assert len([c for c in cmds if fakehosts.RESTORE.search(c)]) == 1, name
        assert uploaded_record(r, name) == (), name  # the previous release stays recorded


def test_a_knob_worth_of_tolerance_lets_the_same_slowdown_through(monkeypatch):
    converge_with_figures()
    fakebench.answer(fakebench.result(single=21.0, four=56.0))
    r = apply(monkeypatch, *UPGRADE, "--data", "bench_tolerance=0.35")
    assert r.exit_code == 0, r.output[-3000:]
    assert bench_of(uploaded_record(r, HEAD)[0])["single_stream_tok_s"] == 21.0


def test_the_first_release_records_its_figures_as_the_baseline(monkeypatch):
    r = apply(monkeypatch)  # bare hosts: a first install
    assert r.exit_code == 0, r.output[-3000:]
    assert len(fakebench.CALLS) == RUNS
    assert fakebench.CALLS[0].url == "https://@fake/spark-a:8000"  # no ssh_hostname: its name
    assert fakebench.CALLS[0].ca_file == f"{fakehosts.TLS_DIR}/ca.crt"  # verified: the pair's CA
    for name in (HEAD, WORKER):
        (release,) = uploaded_record(r, name)
        assert bench_of(release) == kept()
    assert "no figures recorded for the previous release: these are the baseline" in r.output


def test_a_first_release_the_bench_cannot_measure_stops_naming_why(monkeypatch):
    fakebench.answer({"errors": ["single stream, pass 1, prompt 1: connection refused"]})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert len(fakebench.CALLS) == 1  # a run that measured nothing ends the runs
    assert "the short bench measured no baseline: single stream, pass 1, prompt 1: " in r.output
    assert "host data api_url on the head" in r.output and "bench_gate = False" in r.output
    assert all(uploaded_record(r, name) == () for name in (HEAD, WORKER))


def test_an_upgrade_from_a_release_recorded_before_the_gate_makes_the_baseline(monkeypatch):
    converge_with_figures(None)
    fakebench.answer(fakebench.result(single=5.0, four=9.0))  # nothing to compare with
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code == 0, r.output[-3000:]
    assert bench_of(uploaded_record(r, HEAD)[0])["single_stream_tok_s"] == 5.0


def test_the_api_url_host_data_is_where_the_bench_goes(monkeypatch):
    r = apply(monkeypatch, "--data", "api_url=https://127.0.0.1:28000/")
    assert r.exit_code == 0, r.output[-3000:]
    assert [c.url for c in fakebench.CALLS] == ["https://127.0.0.1:28000"] * RUNS


def test_the_knob_off_skips_the_bench_and_promotes_on_the_gates_alone(monkeypatch):
    converge_with_figures()
    fakebench.answer(fakebench.result(single=1.0, four=1.0))
    r = apply(monkeypatch, *UPGRADE, "--data", "bench_gate=False")
    assert r.exit_code == 0, r.output[-3000:]
    assert fakebench.CALLS == []
    assert [x.profile for x in uploaded_record(r, HEAD)] == ["long", "shared"]
    assert bench_of(uploaded_record(r, HEAD)[0]) == {}  # nothing measured, nothing recorded


def test_dry_and_an_unchanged_release_never_run_the_bench(monkeypatch):
    converge_with_figures()
    r = run(["--dry", *UPGRADE, INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output[-3000:]
    assert fakebench.CALLS == []
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output[-3000:]
    assert fakebench.CALLS == []


def test_a_stack_switch_goes_through_the_bench_gate_against_its_own_stacks_figures(monkeypatch):
    """Switching to another stack runs the short bench after the gates; the serving stack's
    figures are no floor for another engine: a slower first run of the new stack is promoted
    and its figures become that stack's baseline (sparkrig/release.py bench_to_reach)."""
    from tests.plan.test_release import another_stack

    converge_with_figures()
    fakebench.answer(fakebench.result(single=12.0, four=30.0))  # far below vllm-nvfp4's
    r = apply(monkeypatch, *another_stack(monkeypatch))
    assert r.exit_code == 0, r.output[-3000:]
    assert len(fakebench.CALLS) == RUNS  # the bench gate ran in the switch
    assert "no figures recorded for the previous release: these are the baseline" in r.output
    for name in (HEAD, WORKER):
        record = uploaded_record(r, name)
        assert [x.stack for x in record] == ["test-other", "vllm-nvfp4"]
        assert bench_of(record[0])["single_stream_tok_s"] == 12.0


def test_an_upgrade_whose_spread_falls_below_the_previous_p10_is_rolled_back(monkeypatch):
    """Medians at the previous release's, one run in three far slower: the p10 (a fifth of the
    way from the slowest run to the middle one) falls below 90% of the previous p10, and the
    rollback names both."""
    converge_with_figures({**PREVIOUS, "single_stream_tok_s.p10": 29.0,
                           "decode_tok_s.4.p10": 78.0})  # fmt: skip
    fast = fakebench.result(single=30.0, four=80.0)
    fakebench.answer(fast, fakebench.result(single=10.0, four=80.0), fast)
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code != 0
    said = ("single-stream decode p10 14.00 tok/s is below 90% of the previous release's p10 "
            "29.00 tok/s (floor 26.10)")  # fmt: skip
    assert said in r.output, r.output[-3000:]
    assert "single-stream decode 30.00 tok/s is below" not in r.output  # the median holds
    assert "upgrade failed (" in r.output and "): bench: " in r.output


def test_a_drafter_that_accepts_too_little_is_rolled_back_naming_figure_and_floor(monkeypatch):
    converge_with_figures()
    low = {**fakebench.result(), "spec_acceptance": 0.04,
           "spec_decode": {"drafts": 960, "draft_tokens": 6720, "accepted_tokens": 269},
           "drafter": {"repo": "incoai/GLM-5.3-Flash-DFlash2", "commit": "7d74cdd8" * 5,
                       "lockfile_sha256": "ab" * 32}}  # fmt: skip
    fakebench.answer(low)
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code != 0
    said = ("short bench held by the acceptance floor: drafter acceptance 4.0% is below the "
            "floor 10% (bench_acceptance_min 0.1; drafter incoai/GLM-5.3-Flash-DFlash2@"
            "7d74cdd87d74, lockfile sha256 abababababab)")  # fmt: skip
    assert said in r.output, r.output[-3000:]
    assert "upgrade failed (" in r.output
