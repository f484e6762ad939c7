"""sparkrig/busbw.py: which smoke-test output becomes the figure kept with the release, and how
status.py prints a kept figure."""

from __future__ import annotations

import json

from sparkrig.busbw import SmokeFigures, figure_text

LINE = json.dumps({"ok": True, "rank": 1, "transport": "IB", "busbw_gbs": 12.1,
                   "algbw_gbs": 12.1, "bytes": 268435456, "iters": 20})  # fmt: skip


class Meta:
    """The parts of pyinfra's OperationMeta that SmokeFigures reads."""

    def __init__(self, success: bool | None, lines: list[str]) -> None:
        self.success, self.stdout_lines = success, lines

    def is_complete(self) -> bool:
        return self.success is not None

    def did_succeed(self) -> bool:
        return self.success is True


def test_only_a_smoke_test_that_ran_and_passed_gives_a_figure() -> None:
    figures = SmokeFigures()
    figures.watch("a", Meta(None, []))  # not run yet (prepare time)
    figures.watch("b", Meta(False, [LINE]))  # failed: the run stops anyway
    figures.watch("c", Meta(True, []))  # skipped: nothing restarted
    figures.watch("d", Meta(True, ["NCCL chatter", LINE]))
    assert [figures.figure_of(h)() for h in "abcx"] == [None] * 4
    want = {"busbw_gbs": 12.1, "algbw_gbs": 12.1, "bytes": 2**28, "iters": 20, "transport": "IB"}
    assert figures.figure_of("d")() == want


def test_figure_text() -> None:
    assert figure_text(None) == figure_text({}) == "busbw -"
    assert figure_text({"busbw_gbs": 12.14, "transport": "IB", "bytes": 2**28, "iters": 20}) == (
        "busbw 12.1 GB/s (NET/IB, 256 MiB x 20)"
    )
    assert figure_text({"busbw_gbs": 0.8}) == "busbw 0.8 GB/s"


def line(busbw: float) -> str:
    return LINE.replace("12.1", str(busbw))


def test_each_function_alone_joins_the_pairs_figure_when_it_passed() -> None:
    figures = SmokeFigures()
    figures.watch("h", Meta(True, [LINE]))
    figures.watch_function("h", "rocep1s0f1", Meta(True, [line(11.9)]))
    figures.watch_function("h", "roceP2p1s0f1", Meta(False, [line(3.0)]))  # failed: not kept
    got = figures.figure_of("h")()
    assert got is not None and got["busbw_gbs"] == 12.1
    assert {k: v for k, v in got.items() if k.startswith("function.")} == {
        "function.rocep1s0f1": 11.9
    }
    # no pair figure, no per-function one either (the pair's test failed or did not run)
    figures.watch_function("x", "rocep1s0f1", Meta(True, [line(11.9)]))
    assert figures.figure_of("x")() is None


def test_figure_text_names_each_function_alone() -> None:
    kept = {"busbw_gbs": 21.44, "transport": "IB", "bytes": 2**28, "iters": 20,
            "function.rocep1s0f1": 11.94, "function.roceP2p1s0f1": 12.0}  # fmt: skip
    assert figure_text(kept) == (
        "busbw 21.4 GB/s (NET/IB, 256 MiB x 20; alone: roceP2p1s0f1 12.0, rocep1s0f1 11.9 GB/s)"
    )
