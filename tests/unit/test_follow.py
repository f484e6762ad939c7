"""``sparkhost follow --print-every`` (files/sparkhost/follow.py): the deploy shows a fetch's
progress at ordinary verbosity, so follow prints a line at most every so often, and always the
last one, whatever the fetch writes meanwhile."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

from sparkhost import follow


def status(state: str, done: int) -> dict[str, object]:
    return {"state": state, "pid": os.getpid(), "bytes_done": done * 2**30,
            "bytes_total": 8 * 2**30, "files_done": done, "files_total": 8, "rate": 1e8,
            "eta_s": 8 - done, "lanes": {"enP7s7": {"rate": 5e7, "state": "running"}}}  # fmt: skip


def followed(tmp_path: Path, print_every: float) -> list[str]:
    path = tmp_path / "status.json"
    path.write_text(json.dumps(status("running", 0)))
    seen = threading.Event()  # follow has read the first status

    def fetch() -> None:
        seen.wait(30)
        for done in range(1, 8):
            path.write_text(json.dumps(status("running", done)))
            time.sleep(0.05)
        path.write_text(json.dumps(status("done", 8)))

    class Watching(io.StringIO):
        def write(self, s: str) -> int:
            seen.set()
            return super().write(s)

    out = Watching()
    writer = threading.Thread(target=fetch)
    writer.start()
    args = follow.build_parser().parse_args(
        ["--status", str(path), "--interval", "0.01", "--print-every", str(print_every)]
    )
    with redirect_stdout(out):
        assert follow.cmd_follow(args) == 0
    writer.join()
    return out.getvalue().splitlines()


def test_a_long_interval_prints_the_first_line_and_the_last(tmp_path):
    lines = followed(tmp_path, print_every=3600)
    assert [x.split()[1:3] for x in lines] == [["running", "0.00/8.00"], ["done", "8.00/8.00"]]


def test_no_interval_prints_every_change(tmp_path):
    lines = followed(tmp_path, print_every=0)
    assert lines[0].startswith("progress running 0.00/8.00") and "enP7s7=" in lines[0]
    assert lines[-1].startswith("progress done") and len(lines) > 2
