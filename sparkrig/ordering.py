"""The rule that keeps worker-before-head: every host runs the same sequence of operations, and
pyinfra runs each operation on every host before the next one (its default barrier; REFERENCE
§10.5). Operations that act on some hosts only still exist on every host and do nothing where
their condition does not hold. ``--serial`` (hosts one after the other, in set order) and
``--no-wait`` (no barrier) would let the head start before its workers, so the deploy refuses
them before any command reaches a host."""

from __future__ import annotations

from pyinfra.api.exceptions import DeployError

ORDER_BREAKING = {
    "serial": "--serial runs the hosts one after the other in an unspecified order",
    "no_wait": "--no-wait drops the barrier between operations",
}


def refuse_unordered_run(params: dict[str, object] | None = None) -> None:
    """Raise DeployError when the pyinfra command line asks for ``--serial`` or ``--no-wait``.

    pyinfra 3.10 keeps neither in its state or config: they are arguments of the CLI's
    ``_main`` (pyinfra_cli/cli.py), so they are read from the running click command."""
    if params is None:
        import click

        ctx = click.get_current_context(silent=True)
        params = dict(ctx.params) if ctx is not None else {}
    asked = [reason for key, reason in ORDER_BREAKING.items() if params.get(key)]
    if asked:
        raise DeployError(
            "sparkrig refuses this run: "
            + "; ".join(asked)
            + ". Every host must run the same operations in step so the workers' ranks start "
            "before the head's (worker-before-head); run without --serial and --no-wait."
        )
