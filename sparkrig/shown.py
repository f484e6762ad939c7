"""A command whose output the operator sees as it comes, at pyinfra's ordinary verbosity.

pyinfra prints a command's output only with ``-vvv`` (``state.print_output``); the lines of a
fetch that runs for hours or of an engine that boots for up to an hour are what the operator
waits on, so those commands print theirs, prefixed with the host, whatever the verbosity."""

from __future__ import annotations

from typing import Any

from pyinfra.api import StringCommand


class ShownCommand(StringCommand):
    """``StringCommand`` that prints its output lines as they arrive (stdout and stderr)."""

    def execute(self, state: Any, host: Any, connector_arguments: Any) -> Any:
        connector_arguments.update(self.connector_arguments)
        return host.run_shell_command(
            self, print_output=True, print_input=state.print_input, **connector_arguments
        )
