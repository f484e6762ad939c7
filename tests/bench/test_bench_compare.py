"""python3 -m sparkrig.bench compare: two stacks' seed-004 results (tests/bench/fixtures) in one
table and one figure, each judged against its own stack's published figures (seed 004 line 7)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench_helpers import count_colour, read_figure, svg_text

from sparkrig.bench import __main__ as cli
from sparkrig.bench import compare, expected, published

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ENTRPI, TENSORFOLD = FIXTURES / "seed004-entrpi-exl3.json", FIXTURES / "seed004-tensorfold.json"
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)  # tab10's first two: one colour per stack


def row(out: str, label: str) -> list[str]:
    """One figure's row of the table: its cells, column by column ([measured, published,
    status] for each stack)."""
    line = next(ln for ln in out.splitlines() if ln.startswith(label))
    return [c.split() for c in line.split("|")[1:]]  # type: ignore[misc]


def test_two_stacks_side_by_side_each_against_its_own_published_figures(
    tmp_path: Path, capsys: object
) -> None:
    rc = cli.main(["compare", str(ENTRPI), str(TENSORFOLD), "--out", str(tmp_path / "cmp")])
    assert rc == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    header = next(ln for ln in out.splitlines() if "entrpi-exl3" in ln and "tensorfold" in ln)
    assert header.index("entrpi-exl3") < header.index("tensorfold")  # one column per result
    # prose: Entrpi 27.0 against its 27.4; TensorFold 31.0 against its own 35.8 is short (against
    # Entrpi's 27.4 it would read better)
    assert row(out, "prose decode") == [["27", "27.4", "WITHIN"], ["31", "35.8", "SHORT"]]
    # code at reasoning low: Entrpi 44.1 short of 53.6; TensorFold 36.0 within its 36.3
    assert row(out, "code decode, reasoning low") == [
        ["44.1", "53.6", "SHORT"],
        ["36", "36.3", "WITHIN"],
    ]
    assert row(out, "code decode, reasoning max") == [
        ["63.5", "62.7", "WITHIN"],
        ["44.9", "44.6", "WITHIN"],
    ]
    assert row(out, "prefill, prose prompt") == [
        ["1372", "1369", "WITHIN"],
        ["1340", "1342", "WITHIN"],
    ]
    assert row(out, "prefill, code prompt") == [
        ["1290", "1306", "WITHIN"],
        ["1360", "1364", "WITHIN"],
    ]
    assert out.count("004_d4f0c35b177c450a.txt") == 2  # each stack's source, once
    assert re.search(r"entrpi-exl3: seed 004 .*Entrpi's kit", out)
    assert "SVG: " + str(tmp_path / "cmp.svg") in out


def test_the_figure_is_one_svg_and_one_png_with_both_stacks(tmp_path: Path) -> None:
    cols = compare.columns([ENTRPI, TENSORFOLD], None)
    svg_path, png_path = compare.draw(cols, tmp_path / "side-by-side")
    assert (svg_path.name, png_path.name) == ("side-by-side.svg", "side-by-side.png")
    pixels, svg = read_figure(tmp_path / "side-by-side")
    words = svg_text(svg)
    for said in ("entrpi-exl3", "tensorfold", "published (each stack's own)", "decode tok/s",
                 "prefill tok/s", "code decode, reasoning max"):  # fmt: skip
        assert said in words, said
    assert count_colour(pixels, BLUE) > 2000 and count_colour(pixels, ORANGE) > 2000


def test_a_published_figures_file_gives_a_stack_its_figures(tmp_path: Path, capsys: object) -> None:
    """The seam for the stack declarations: a file names a stack's figures per protocol; a stack
    it names takes only those; a stack nobody publishes for is listed as such."""
    mine = json.loads(TENSORFOLD.read_text()) | {"stack": "vllm-nvfp4"}
    (tmp_path / "mine.json").write_text(json.dumps(mine))
    figures = {"vllm-nvfp4": {"seed004": [
        {"figure": "prose_decode_tok_s", "value": [30.0, 32.0], "source": "a test's own figure",
         "condition": "made up"}]}}  # fmt: skip
    (tmp_path / "published.json").write_text(json.dumps(figures))
    nobody = json.loads(ENTRPI.read_text()) | {"stack": "sfxnz-v13"}
    (tmp_path / "nobody.json").write_text(json.dumps(nobody))
    argv = ["compare", str(tmp_path / "mine.json"), str(tmp_path / "nobody.json"), "--published",
            str(tmp_path / "published.json"), "--out", str(tmp_path / "c")]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert row(out, "prose decode") == [["31", "30-32", "WITHIN"], ["27", "-"]]
    assert row(out, "code decode, reasoning low") == [
        ["36", "-"],
        ["44.1", "-"],
    ]  # no figure, no verdict
    assert "vllm-nvfp4: a test's own figure; made up" in out
    assert "sfxnz-v13: none known for protocol seed004" in out


def test_a_bad_published_file_is_refused_naming_what_is_wrong(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "published.json"
    bad.write_text(json.dumps({"tensorfold": {"seed004": [{"figure": "prose_decode_tok_s"}]}}))
    argv = ["compare", str(TENSORFOLD), "--published", str(bad), "--out", str(tmp_path / "c")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "tensorfold seed004: each figure needs figure, value and source" in err
    assert not (tmp_path / "c.png").exists()


def test_two_results_of_one_stack_get_two_columns() -> None:
    cols = compare.columns([TENSORFOLD, TENSORFOLD], None)
    assert [c.name for c in cols] == ["tensorfold", "tensorfold (2)"]
    assert cols[1].published == published.builtin("tensorfold", "seed004", None) != []


def test_the_same_results_redraw_the_same_files(tmp_path: Path) -> None:
    """No date and no random ids in the SVG, so a committed figure changes only with its data."""
    cols = compare.columns([ENTRPI, TENSORFOLD], None)
    first = [p.read_bytes() for p in compare.draw(cols, tmp_path / "a")]
    again = [p.read_bytes() for p in compare.draw(cols, tmp_path / "b")]
    assert first == again


def test_a_run_is_judged_by_its_own_stacks_figures_only() -> None:
    """Seed 000's figures are today's recipe's (vllm-nvfp4, or no stack named): a seed-000 run of
    another stack is not judged by them; the causes named when short are that recipe's."""
    run = {"protocol_name": "seed000", "profile": "shared", "single_stream_tok_s": 10.0}
    for stack in (None, "vllm-nvfp4"):
        rows = expected.verdicts_of(published.figures_for(run | {"stack": stack}), run, 0.1)
        single = next(r for r in rows if r["figure"] == "single_stream_tok_s")
        assert single["status"] == "short" and "speculation not active" in single["causes"]
    assert published.figures_for(run | {"stack": "entrpi-exl3"}) == []
    slow = json.loads(TENSORFOLD.read_text())
    rows = expected.verdicts_of(published.figures_for(slow), slow, 0.1)
    assert [r["status"] for r in rows][:1] == ["short"] and rows[0]["causes"] == ""


def test_the_stack_declarations_are_the_one_source_of_published_figures(monkeypatch) -> None:
    """A result is judged by its stack's declared figures (Stack.figures): change the
    declaration and the verdict follows; no declared stack has a table of its own here."""
    from dataclasses import replace

    from sparkrig.stacks import STACKS
    from sparkrig.stacks.base import Figure

    run = {"stack": "entrpi-exl3", "protocol_name": "seed004"}
    assert published.figures_for(run) == [
        f for f in STACKS["entrpi-exl3"].figures if f.protocol == "seed004"
    ]
    mine = Figure("prose_decode_tok_s", 99.0, "tok/s", "seed004", "a test")
    monkeypatch.setitem(STACKS, "entrpi-exl3", replace(STACKS["entrpi-exl3"], figures=(mine,)))
    assert published.figures_for(run) == [mine]
    assert not set(published.UNDECLARED) & set(STACKS)  # undeclared stacks only


def test_a_seed000_run_of_tensorfold_is_shown_beside_miaais_own_figures() -> None:
    """The tensorfold declaration's figures (MiaAI README: 60.4 tok/s alone, 108.8 total at 4,
    prefill 1,952) are the published column of a seed-000 run on that stack, marked as the
    publisher's protocol; its seed-004 figures stay seed 004's (35.8 prose, 1,342 prefill)."""
    run = {"protocol_name": "seed000", "profile": "shared", "stack": "tensorfold",
           "single_stream_tok_s": 58.0, "decode_tok_s": {"4": 90.0},
           "prefill": [{"prefill_tok_s": 1900.0}]}  # fmt: skip
    figures = {f.figure: f for f in published.figures_for(run)}
    assert {k: f.low for k, f in figures.items()} == {
        "single_stream_tok_s": 60.4,
        "decode_tok_s.4": 108.8,
        "prefill_tok_s": 1952.0,
    }
    assert all("miaai protocol" in f.condition for f in figures.values())
    rows = {
        r["figure"]: r["status"] for r in expected.verdicts_of(list(figures.values()), run, 0.1)
    }
    assert rows == {"single_stream_tok_s": "within", "decode_tok_s.4": "short",
                    "prefill_tok_s": "within"}  # fmt: skip
    assert published.figures_for(run | {"profile": "single"}) == []  # measured on shared only
    seed4 = {f.figure: f.low for f in published.figures_for(run | {"protocol_name": "seed004"})}
    assert seed4["prose_decode_tok_s"] == 35.8 and seed4["prose_prefill_tok_s"] == 1342.0


RELEASE_A = FIXTURES / "release-gate-vllm-nvfp4-A.json"  # made up: the field's honest figures
RELEASE_B = FIXTURES / "release-gate-vllm-nvfp4-B.json"  # made up: other drafter bytes, slower
OLD_SEED000 = FIXTURES.parents[2] / "bench" / "results" / "example-standin-shared.json"


def test_two_releases_side_by_side_with_spread_acceptance_drafter_and_fabric(
    tmp_path: Path, capsys: object
) -> None:
    """The release gate's results of two releases (three runs each): a column per release,
    named by its stack and when it ran; each speed's p10 under its median; the drafter's
    acceptance against the figure users publish for this drafter revision (34-36%,
    tonyd2wild/GLM-5.3-Flash-NVFP4-DFlash2-2x-DGX-Spark#7); which drafter files each was; the
    fabric's bus bandwidth. The figure draws the acceptance and the fabric in panels of their
    own."""
    rc = cli.main(["compare", str(RELEASE_A), str(RELEASE_B), "--out", str(tmp_path / "rel")])
    assert rc == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    header = next(ln for ln in out.splitlines() if "2026-12-05T09:00:00Z" in ln)
    assert "vllm-nvfp4 2026-12-05T09:00:00Z" in header and "vllm-nvfp4 2026-12-06" in header
    assert row(out, "1 stream  ") == [["30.5", "30.84", "WITHIN"], ["18.2", "30.84", "SHORT"]]
    assert row(out, "1 stream p10") == [["29.8", "-"], ["15.1", "-"]]
    assert row(out, "4 streams p10") == [["64.9", "-"], ["44.3", "-"]]
    assert row(out, "drafter acceptance") == [
        ["0.35", "0.34-0.36", "WITHIN"],
        ["0.05", "0.34-0.36", "SHORT"],
    ]
    assert row(out, "acceptance length") == [["3.45", "-"], ["1.35", "-"]]
    assert row(out, "fabric busbw (GB/s)") == [["12.1", "-"], ["6.2", "-"]]
    assert ("drafter incoai/GLM-5.3-Flash-DFlash2@7d74cdd881ed, lockfile sha256 3f3f3f3f3f3f; "
            "model.safetensors 8931dc528931; release gate, 3 runs") in out  # fmt: skip
    assert "lockfile sha256 c4c4c4c4c4c4; model.safetensors b038e1d9b038" in out
    assert "GLM-5.3-Flash-NVFP4-DFlash2-2x-DGX-Spark#7" in out  # the acceptance's source
    _, svg = read_figure(tmp_path / "rel")
    words = svg_text(svg)
    for said in ("1 stream p10", "drafter acceptance", "fabric busbw GB/s"):
        assert said in words, said


def test_results_from_before_the_new_figures_still_compare(capsys: object, tmp_path: Path) -> None:
    """A seed-000 result written before spread, acceptance and fabric were recorded (the
    committed example) and seed 004's fixtures: compared as before, with no p10, acceptance or
    fabric row, beside a result that has them."""
    argv = ["compare", str(OLD_SEED000), str(TENSORFOLD), str(RELEASE_A), "--out",
            str(tmp_path / "c")]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    old, tensorfold, _ = row(out, "drafter acceptance")
    assert old == ["-", "-"] and tensorfold == ["-", "-"]
    assert row(out, "1 stream p10")[0] == ["-", "-"]
    assert row(out, "fabric busbw (GB/s)")[:2] == [["-", "-"], ["-", "-"]]
    assert row(out, "prose decode")[1] == ["31", "35.8", "SHORT"]
    assert row(out, "1 stream  ")[0][0] == "26.41"  # the old result's own figure, as before
    assert (
        "example-standin-shared: " not in out.split("drafters and runs:")[1].split("published")[0]
    )


def test_a_long_prefill_is_judged_by_the_ttft_published_for_its_context() -> None:
    """Seed 000's 200K prompt (TTFT 139.2 s) judges the context the bench ran as --contexts 200K
    (204,800 tokens), and no other; the sfxnz README's 318,123-token one its own stack's."""
    rows = [{"target_tokens": 32768, "prompt_tokens": 32700, "ttft_s": 25.0},
            {"target_tokens": 204800, "prompt_tokens": 204700, "ttft_s": 180.0}]  # fmt: skip
    run = {"protocol_name": "seed000", "profile": "single", "stack": "vllm-nvfp4", "prefill": rows}
    verdicts = expected.verdicts_of(published.figures_for(run), run, 0.1)
    ttft = next(r for r in verdicts if r["figure"] == "prefill_ttft_s.204800")
    assert ttft["status"] == "short" and "slow prefill" in ttft["causes"]
    assert expected.lookup(run, "prefill_ttft_s.204800") == [180.0]
    assert expected.lookup({**run, "prefill": rows[:1]}, "prefill_ttft_s.204800") == []
    sfxnz = {**run, "stack": "sfxnz-v13", "prefill": [{"target_tokens": 318123, "ttft_s": 240.0}]}
    long = next(r for r in expected.verdicts_of(published.figures_for(sfxnz), sfxnz, 0.1)
                if r["figure"] == "prefill_ttft_s.318123")  # fmt: skip
    assert long["status"] in ("within", "better")
