"""The one reader of secret files: the Hub token, the agents' pair secret, the API key.

A secret is the file's text without surrounding whitespace. It is returned, never printed: no
message here carries it."""

from __future__ import annotations

import os
import sys


def read_secret(path: str, *, required: bool = False, warn_shared: bool = False) -> str | None:
    """The secret in ``path`` (``~`` expanded); None when the file is empty, or ValueError when
    ``required``. ``warn_shared``: say on stderr when group or others may read the file."""
    path = os.path.expanduser(path)
    with open(path, encoding="utf-8") as f:
        if warn_shared and os.fstat(f.fileno()).st_mode & 0o077:
            print(f"warning: secret file {path} is readable by group/others", file=sys.stderr)
        secret = f.read().strip()
    if not secret and required:
        raise ValueError(f"{path} is empty")
    return secret or None
