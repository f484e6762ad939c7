"""sparkrig/benchgate.py's pure parts: which figures the gate keeps, the floor each must reach
against the previous release's (both named), the baseline, and where the bench is pointed."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkrig import benchgate as bg
from sparkrig.config.api import api_ca_file, api_url
from sparkrig.config.inventory import build
from tests.unit.conftest import cluster
from tests.unit.test_settings import edit, problems

PREVIOUS = {"single_stream_tok_s": 30.0, "decode_tok_s.4": 80.0, "tool_call_ok": True,
            "fffd_per_10k_chars": 0.0, "fffd_chars": 3000}  # fmt: skip


def now(**changes: object) -> dict[str, object]:
    return {**PREVIOUS, **changes}


def test_the_figures_kept_are_the_short_benchs_json_names() -> None:
    result = {"single_stream_tok_s": 30.8, "decode_tok_s": {"1": 30.8, "4": 81.2},
              "tool_call_ok": True, "fffd_per_10k_chars": 3.3, "fffd_chars": 3030,
              "prefill": [], "errors": []}  # fmt: skip
    assert bg.figures_of(result) == {"single_stream_tok_s": 30.8, "decode_tok_s.4": 81.2,
                                     "tool_call_ok": True, "fffd_per_10k_chars": 3.3,
                                     "fffd_chars": 3030}  # fmt: skip


def test_speeds_at_the_floor_pass_and_below_it_fail_naming_both_figures() -> None:
    assert bg.shortfalls(PREVIOUS, now(single_stream_tok_s=27.0, **{"decode_tok_s.4": 72.0}),
                         0.10) == []  # fmt: skip
    falls = bg.shortfalls(PREVIOUS, now(single_stream_tok_s=26.9), 0.10)
    assert falls == ["single-stream decode 26.90 tok/s is below 90% of the previous release's "
                     "30.00 tok/s (floor 27.00)"]  # fmt: skip
    falls = bg.shortfalls(PREVIOUS, now(**{"decode_tok_s.4": None}), 0.10)
    assert falls == ["4-stream aggregate decode not measured (previous release 80.00 tok/s)"]


def test_the_tool_call_must_still_parse() -> None:
    assert bg.shortfalls(PREVIOUS, now(tool_call_ok=False), 0.1) == [
        "tool call did not parse (previous release: parsed)"
    ]
    assert bg.shortfalls({**PREVIOUS, "tool_call_ok": None}, now(tool_call_ok=False), 0.1) == []


def test_corruption_may_rise_by_the_tolerance_plus_one_character_in_this_answer() -> None:
    one = 10000 / 3000  # one U+FFFD in a 3,000-character answer: 3.33 per 10k
    assert bg.shortfalls(PREVIOUS, now(fffd_per_10k_chars=one), 0.1) == []
    falls = bg.shortfalls(PREVIOUS, now(fffd_per_10k_chars=2 * one), 0.1)
    assert falls == ["corruption probe 6.67 U+FFFD per 10k chars is above the previous "
                     "release's 0.00 (ceiling 3.33)"]  # fmt: skip


def test_a_previous_release_without_figures_makes_the_new_ones_the_baseline() -> None:
    figures, said = bg.verdict({"single_stream_tok_s": 5.0, "decode_tok_s": {"4": 9.0}}, {}, 0.1)
    assert figures is not None and figures["single_stream_tok_s"] == 5.0
    assert said.endswith("no figures recorded for the previous release: these are the baseline")
    figures, said = bg.verdict({"errors": ["connection refused"]}, {}, 0.1)
    assert figures is None and "measured no baseline: connection refused" in said


def test_a_shortfall_records_nothing_and_says_the_tolerance() -> None:
    result = {"single_stream_tok_s": 21.0, "decode_tok_s": {"4": 56.0}, "tool_call_ok": True,
              "fffd_per_10k_chars": 0.0, "fffd_chars": 3000, "errors": []}  # fmt: skip
    figures, said = bg.verdict(result, PREVIOUS, 0.1)
    assert figures is None
    assert said.startswith("short bench below 90% of the previous release (bench_tolerance 0.1): ")
    assert "21.00 tok/s" in said and "30.00 tok/s" in said and "56.00" in said and "80.00" in said


def run(single: float, four: float, **more: object) -> dict[str, object]:
    """One short bench's JSON."""
    return {"single_stream_tok_s": single, "decode_tok_s": {"1": single, "4": four},
            "tool_call_ok": True, "fffd_per_10k_chars": 0.0, "fffd_chars": 3000, "errors": [],
            **more}  # fmt: skip


def test_several_runs_keep_the_median_and_the_p10_of_each_speed() -> None:
    figures = bg.gate_figures([run(30.0, 80.0), run(20.0, 70.0), run(31.0, 90.0)])
    assert figures["runs"] == 3
    assert (figures["single_stream_tok_s"], figures["single_stream_tok_s.p10"]) == (30.0, 22.0)
    assert (figures["decode_tok_s.4"], figures["decode_tok_s.4.p10"]) == (80.0, 72.0)
    assert figures["fffd_chars"] == 9000 and figures["tool_call_ok"] is True
    assert "spec_acceptance" not in figures  # no engine drafted: nothing kept


def test_a_p10_below_the_previous_p10_fails_like_a_median_naming_both() -> None:
    previous = {**PREVIOUS, "single_stream_tok_s.p10": 29.0, "decode_tok_s.4.p10": 78.0}
    ok = bg.gate_figures([run(30.0, 80.0)] * 3)
    assert bg.shortfalls(previous, ok, 0.10) == []
    spread = bg.gate_figures([run(30.0, 80.0), run(10.0, 80.0), run(30.0, 80.0)])
    assert bg.shortfalls(previous, spread, 0.10) == [
        "single-stream decode p10 14.00 tok/s is below 90% of the previous release's p10 "
        "29.00 tok/s (floor 26.10)"
    ]
    figures, said = bg.verdict([run(30.0, 80.0), run(10.0, 80.0), run(30.0, 80.0)], previous, 0.1)
    assert figures is None and "p10 14.00 tok/s" in said and "p10 29.00 tok/s" in said
    # a previous release kept before p10 was: its median only is held
    assert bg.shortfalls(PREVIOUS, spread, 0.10) == []


DRAFTER = {"repo": "incoai/GLM-5.3-Flash-DFlash2", "commit": "7d74cdd8" * 5,
           "lockfile_sha256": "ab" * 32}  # fmt: skip


def drafted(share: float, drafter: object = DRAFTER) -> dict[str, object]:
    tokens = 7000
    return run(30.0, 80.0, drafter=drafter, spec_acceptance=share,
               spec_decode={"drafts": 1000, "draft_tokens": tokens,
                            "accepted_tokens": round(share * tokens)})  # fmt: skip


def test_a_drafter_below_the_acceptance_floor_is_refused_naming_the_figure_and_floor() -> None:
    """Pooled over the runs; the floor holds a first release too (no previous figures)."""
    figures, said = bg.verdict([drafted(0.05), drafted(0.07)], PREVIOUS, 0.1, 0.10)
    assert figures is None
    assert said == ("short bench held by the acceptance floor: drafter acceptance 6.0% is below "
                    "the floor 10% (bench_acceptance_min 0.1; drafter incoai/GLM-5.3-Flash-"
                    "DFlash2@7d74cdd87d74, lockfile sha256 abababababab): a drafter that does "
                    "not fit the model")  # fmt: skip
    figures, said = bg.verdict([drafted(0.05)], {}, 0.1, 0.10)
    assert figures is None and "acceptance 5.0% is below the floor 10%" in said
    figures, said = bg.verdict([drafted(0.35)] * 3, PREVIOUS, 0.1, 0.10)
    assert figures is not None and figures["spec_acceptance"] == 0.35
    assert figures["drafter_lockfile_sha256"] == "ab" * 32  # the identity, beside it
    assert "drafter acceptance 35.0% (floor 10%; incoai/GLM-5.3-Flash-DFlash2@" in said


def test_a_release_without_a_drafter_skips_the_floor_saying_so() -> None:
    figures, said = bg.verdict([drafted(0.02, drafter=None)], PREVIOUS, 0.1, 0.10)
    assert figures is not None  # MTP at 2%: no drafter of the release to hold
    assert (
        "drafter acceptance 2.0%; no drafter in this release: the acceptance floor is not "
        "held" in said
    )
    figures, said = bg.verdict([run(30.0, 80.0, drafter=DRAFTER, spec_acceptance=None,
                                    spec_decode={"note": "no spec-decode counters on /metrics"})],
                               PREVIOUS, 0.1, 0.10)  # fmt: skip
    assert figures is not None
    assert (
        "acceptance not measured (no spec-decode counters on /metrics): its floor is not "
        "held" in said
    )


def test_the_gate_knobs_are_bounded() -> None:
    assert "bench_gate_runs: Input should be greater than or equal to 1" in problems(
        edit(cluster(2), "head", 0, bench_gate_runs=0)
    )
    assert "bench_acceptance_min: Input should be less than or equal to 1" in problems(
        edit(cluster(2), "head", 0, bench_acceptance_min=1.5)
    )
    knobs = build(cluster(2))["spark-0"].knobs
    assert (knobs.bench_gate_runs, knobs.bench_acceptance_min) == (3, 0.10)


def test_the_bench_runs_as_a_child_with_the_key_as_an_absolute_file_name(tmp_path: Path) -> None:
    target = bg.Target("https://h:8000", "m", ".sparkrig/api-key", "shared")
    argv = bg.bench_argv(target, tmp_path / "r.json")
    assert argv[1:4] == ["-m", "sparkrig.bench", "--short"]
    assert argv[argv.index("--api-key-file") + 1] == str(Path(".sparkrig/api-key").resolve())
    assert "--api-key-file" not in bg.bench_argv(bg.Target("u", "m", None, "p"), tmp_path)
    lock = "locks/incoai--GLM-5.3-Flash-DFlash2.lock.json"
    argv = bg.bench_argv(bg.Target("u", "m", None, "single", drafter_lock=lock, stack="s"),
                         tmp_path)  # fmt: skip
    assert argv[argv.index("--drafter-lock") + 1] == str(Path(lock).resolve())
    assert argv[argv.index("--stack") + 1] == "s"


def test_the_heads_api_url_defaults_to_its_ssh_hostname_or_name_and_can_be_set() -> None:
    assert api_url(build(cluster(2))["spark-1"]) == "https://spark-0:8000"
    view = edit(cluster(2), "head", 0, ssh_hostname="10.0.0.5", api_port=8080)
    view = edit(view, "worker", 0, api_port=8080)
    assert api_url(build(view)["spark-1"]) == "https://10.0.0.5:8080"
    view = edit(cluster(2), "head", 0, api_url="https://127.0.0.1:28000/")
    assert api_url(build(view)["spark-1"]) == "https://127.0.0.1:28000"
    plain = edit(edit(cluster(2), "head", 0, api_tls=False), "worker", 0, api_tls=False)
    assert api_url(build(plain)["spark-1"]) == "http://spark-0:8000"


def test_an_api_url_of_the_other_scheme_is_refused() -> None:
    said = problems(edit(cluster(2), "head", 0, api_url="http://127.0.0.1:28000"))
    assert (
        "spark-0: api_url: http://127.0.0.1:28000 is not https:// but the front serves HTTPS"
        in said
    )
    view = edit(edit(cluster(2), "head", 0, api_url="https://h:1", api_tls=False), "worker", 0,
                api_tls=False)  # fmt: skip
    assert "is not http:// but the front serves HTTP (api_tls = False)" in problems(view)


def test_the_bench_verifies_the_front_with_the_pairs_ca(tmp_path: Path) -> None:
    s = build(cluster(2))["spark-1"]
    assert api_ca_file(s) == ".sparkrig/tls/ca.crt"
    target = bg.Target("https://h:8000", "m", None, "shared", ca_file=api_ca_file(s))
    argv = bg.bench_argv(target, tmp_path / "r.json")
    assert argv[argv.index("--cacert") + 1] == str(Path(".sparkrig/tls/ca.crt").resolve())
    own = edit(cluster(2), "head", 0, tls_cert="c.pem", tls_key="k.pem")
    assert api_ca_file(build(own)["spark-0"]) is None  # the operator's: the system's trust


@pytest.mark.parametrize("bad", ["127.0.0.1:8000", "ftp://h", "http://"])
def test_a_bad_api_url_is_refused(bad: str) -> None:
    assert "spark-0: api_url: String should match pattern" in problems(
        edit(cluster(2), "head", 0, api_url=bad)
    )


def test_two_benches_of_one_second_never_get_one_result_file(tmp_path: Path) -> None:
    """Two pairs' heads bench at once (one operation, every head in parallel): the file each
    bench writes is taken when it is named, so the second of the same second gets another."""
    path = tmp_path / "release-gate-20260101T000000Z.json"
    first, second = bg._fresh(path), bg._fresh(path)
    assert first == path and second == tmp_path / "release-gate-20260101T000000Z-2.json"
    assert first.exists() and second.exists()
