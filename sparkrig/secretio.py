"""Secrets on a host without a file another user can read, and without printing them.

pyinfra's uploads cross ``/tmp/pyinfra-<sha1(dest)>`` as the SSH user (0644 under umask 022)
before ``sudo cp``, and leave it behind when the copy fails (docs/attack-surface-facts.md 5a-5e);
its facts' output is printed at ``-vvv`` (5g). So a secret (pair secret, API key, Hub token):

- is written by one command fed on **stdin** over the SSH channel (``_stdin``: pyinfra logs the
  command, never its stdin, 5i): ``umask 077``, ``install -m 600 /dev/stdin <dest>.sparkrig-new``,
  its sha256 checked, then renamed over ``dest``; a failure removes the temp file. Nothing lands
  as the SSH user, and the secret is in no argv (only its sha256 is);
- is judged by its digest (``SecretDigest``: sha256 and length, never the bytes), so a state read,
  ``--dry`` and ``-vvv`` carry no secret;
- is read back only at apply time, and only where a value must travel (a rank lacking the pair's
  secret gets a holder's; the control side's copy of the head's key): ``read_secret_now``, a
  command run with ``print_output=False, print_input=False``, never a fact.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.api.exceptions import FactProcessError

from sparkrig.factlines import END

# sh -c script: $1 the destination, $2 the sha256 the bytes on stdin must have
INSTALL_SCRIPT = (
    'umask 077 && t="$1.sparkrig-new" && install -m 600 -o root -g root /dev/stdin "$t" && '
    '[ "$(sha256sum < "$t" | cut -c1-64)" = "$2" ] && mv -f "$t" "$1" || '
    '{ rm -f "$t"; echo "sparkrig: the secret for $1 was not installed (digest mismatch or '
    'write error); nothing left behind" >&2; exit 1; }'
)


def digest(text: str) -> str:
    """The sha256 of a secret file holding exactly ``text``."""
    return hashlib.sha256(text.encode()).hexdigest()


def install_command(text: str, dest: str) -> StringCommand:
    """The one command that writes ``text`` (ending in a newline: pyinfra's ``write_stdin`` adds
    one otherwise) to ``dest`` as a 0600 root file, fed on stdin; its argv holds only the digest."""
    if not text.endswith("\n"):
        raise ValueError("a secret file's text ends with a newline (pyinfra's stdin adds one)")
    return StringCommand(
        "sh", "-c", QuoteString(INSTALL_SCRIPT), "sh", QuoteString(dest), digest(text), _stdin=text
    )


@dataclass(frozen=True)
class Held:
    """What a host holds of a secret, as ``SecretDigest`` reads it: the file's sha256 ("" when
    there is none) and the length of its text without whitespace."""

    sha256: str = ""
    chars: int = 0

    @classmethod
    def of(cls, text: str) -> Held:
        """What a host holding ``text`` (stripped, one line) reports; ``Held()`` for ""."""
        return cls(digest(text + "\n"), len(text)) if text else cls()

    def __bool__(self) -> bool:
        return bool(self.sha256)


class SecretDigest(FactBase[Held]):
    """
    A secret installed on this host, by digest only: its sha256 and its length (whitespace
    left out), never its bytes. ``Held()`` when the file does not exist or is empty.
    """

    default = Held

    def command(self, path: str) -> StringCommand:
        q = QuoteString(path)
        return StringCommand(
            "if [ -s", q, "]; then sha256sum <", q, "| cut -c1-64; tr -d ' \\t\\r\\n' <", q,
            "| wc -c; fi;", "echo", QuoteString(END),
        )  # fmt: skip

    def process(self, output: list[str]) -> Held:
        if END not in output:
            raise FactProcessError("secret digest read ended early (no end marker)")
        lines = [line.strip() for line in output[: output.index(END)] if line.strip()]
        if not lines:
            return Held()
        if len(lines) != 2 or len(lines[0]) != 64 or not lines[1].isdigit():
            raise FactProcessError("the secret digest read gave no sha256 and length")
        return Held(lines[0], int(lines[1]))


def read_secret_now(target: Any, path: str) -> str:
    """The secret at ``path`` on ``target`` (a pyinfra Host), stripped, read at apply time with
    nothing printed (not at ``-vvv``: print_output and print_input off); "" when unreadable. Never
    call it while planning: ``--dry`` must not read a secret."""
    ok, out = target.connector.run_shell_command(
        StringCommand("cat", QuoteString(path)),
        print_output=False,
        print_input=False,
        _sudo=True,
    )
    return "\n".join(out.stdout_lines).strip() if ok else ""


@operation()
def secret_relayed(
    source: str, source_path: str, dest: str, sha256: str, shape: str = "{}\n"
) -> Generator[Any, None, None]:
    """
    Install, on this host, a secret another host holds and the control machine lacks, copied at
    apply time (read there unprinted, written here through stdin, its digest checked); under
    ``--dry`` nothing is read.

    + source: the inventory name of the host holding it
    + source_path: the secret's path there
    + dest: its path here (0600 root)
    + sha256: the digest this host's file must have once written (the holder's)
    + shape: the text written, ``{}`` standing for the secret (default: it and a newline)
    """

    def relay(state: Any, host: Any) -> bool:  # pyinfra passes these two by name
        here, holder = host, state.inventory.get_host(source)
        secret = read_secret_now(holder, source_path)
        text = shape.format(secret)
        if not secret or digest(text) != sha256:
            logger.error(
                f"{here.print_prefix}could not copy the secret from {source} ({source_path}): "
                "it changed or is unreadable there; run the deploy again"
            )
            return False
        ok, _ = here.connector.run_shell_command(
            install_command(text, dest), print_output=False, print_input=False, _sudo=True,
            _stdin=text,
        )  # fmt: skip
        return bool(ok)

    logger.info(f"{host.print_prefix}Will copy {dest} from {source} (secret: content not shown)")
    yield FunctionCommand(relay, (), {})


def write_control_file(path: Path, data: bytes, secret: bool) -> None:
    """``data`` into the control side's ``path``, renamed over; a secret is 0600 from its first
    byte, so no reader ever sees it wider."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.sparkrig-new")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
