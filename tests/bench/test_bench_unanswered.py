"""The bench against an API that does not answer (issue 49): one line, exit 1, no file written."""

from __future__ import annotations

import socket

from sparkrig.bench.__main__ import main


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens


def test_an_api_that_does_not_answer_is_one_line_and_writes_nothing(tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    out = tmp_path / "results"
    rc = main(["--url", url, "--model", "glm-5.3-flash", "--results-dir", str(out)])
    said = capsys.readouterr()
    assert rc == 1
    lines = said.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"bench: {url} does not answer"), said.err
    assert "nothing written" in lines[0]
    assert said.out == ""
    assert not out.exists()
