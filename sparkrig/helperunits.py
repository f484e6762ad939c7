"""The pair's helpers: the stop-together watch (``sparkrig-pair``), the worker agent, the pair
supervisor, the watchdog and the ordered restart command. Their template contexts, the file of one
role rendered and owned, and the operations that keep a helper running, with what restarts one
(its unit, the agents' secret, its program).

The helpers run the host package's ``pair`` job (files/sparkhost/pair.py); the rank unit they stand
beside: sparkrig/serving.py."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from typing import Any

from pyinfra import host
from pyinfra.api.operation import OperationMeta

from sparkrig import engines, hostpkg
from sparkrig.bringup import starts_in_turn, workers_in_start_order
from sparkrig.config.model import Settings
from sparkrig.front import api_key_file
from sparkrig.gates import probe_command
from sparkrig.hardening import unit_hardening
from sparkrig.owned import file_present, unit_state_set
from sparkrig.paths import paths
from sparkrig.render import base_context, render
from sparkrig.runscope import Watch, watch


def pair_unit_context(s: Settings) -> dict[str, Any]:
    k = s.knobs
    return {
        **base_context(s),
        "peers": ",".join(map(s.dial, s.peers)),
        "pair_port": k.pair_port,
        "pair_grace_s": k.pair_grace_s,
        "hardening": unit_hardening(s, "pair"),
    }


def restart_args(s: Settings) -> str:
    k = s.knobs
    return " ".join(
        [
            "--head-unit", f"{s.head_unit_name}.service",
            "--workers", ",".join(map(s.dial, workers_in_start_order(s))),
            "--port", str(k.pair_port),
            "--agent-port", str(k.agent_port),
            "--token-file", paths(s).pair_token,
            *(["--in-turn"] if starts_in_turn(s) else []),  # one worker at a time, in that order
        ]
    )  # fmt: skip


def agent_unit_context(s: Settings) -> dict[str, Any]:
    return {
        **base_context(s),
        "agent_port": s.knobs.agent_port,
        "token_file": paths(s).pair_token,
        "hardening": unit_hardening(s, "agent"),
    }


def progress_url(s: Settings) -> str:
    """What the watchdog reads for progress (``Stack.progress_path``): the engine on its own
    loopback port, behind the API front (vLLM's /metrics and TensorFold's /health need no key)."""
    return f"http://127.0.0.1:{s.knobs.engine_port}{s.stack.progress_path}"


def watchdog_unit_context(s: Settings) -> dict[str, Any]:
    k = s.knobs
    return {
        **base_context(s),
        "restart_args": restart_args(s),
        # the watchdog judges the engine itself, on its loopback port (not through the API
        # front: a front down is not a wedged engine, and restarting the pair would not fix it)
        "probe": shlex.join(
            probe_command(
                k.install_dir, k.engine_port, k.served_model_name, key_file=api_key_file(s)
            )
        ),
        "health_url": f"http://127.0.0.1:{k.engine_port}/health",
        "metrics_url": progress_url(s),
        "progress_parser": engines.progress_parser(s.stack),
        "stall": k.watchdog_stall_s,
        "interval": k.watchdog_interval_s,
        "fails": k.watchdog_fails,
        "grace": k.watchdog_grace_s,
        "max_restarts": k.watchdog_max_restarts,
        "window": k.watchdog_window_s,
        "hardening": unit_hardening(s, "watchdog"),
    }


def supervisor_unit_context(s: Settings) -> dict[str, Any]:
    k = s.knobs
    return {
        **base_context(s),
        "restart_args": restart_args(s),
        "agent_port": k.agent_port,
        "max_restarts": k.supervisor_max_restarts,
        "window": k.supervisor_window_s,
        "hardening": unit_hardening(s, "supervisor"),
    }


def role_template(
    on_role: Callable[..., OperationMeta],
    is_head: bool,
    name: str,
    template: str,
    context: Mapping[str, Any],
    dest: str,
    mode: str = "644",
) -> OperationMeta:
    """A file rendered from ``templates/<template>`` and owned whole on the head or on the workers
    alone (``on_role``: ``on_head`` or ``on_workers``), an operation on every host.

    + on_role: sparkrig.ordering's on_head or on_workers
    + is_head: whether this host is the head
    + name: the operation's name
    + template: template under templates/
    + context: its variables
    + dest: remote path (its directory must exist)
    + mode: octal permissions
    """
    text = render(template, **context)
    return on_role(is_head, file_present, name=name, text=text, dest=dest, mode=mode)


HELPERS = {
    "sparkrig-agent": "the worker agent",
    "sparkrig-supervisor": "the pair supervisor",
    "sparkrig-watchdog": "the watchdog",
}


def helper_restarts() -> Watch:
    """The run's watch of what restarts a helper on its host besides its program: the operation
    installing its unit, under ``<host>:<unit>``, and the agents' secret's, under ``<host>:secret``
    (``helper_installed``). The supervisor and the watchdog are kept running after the pair's start
    (tasks/start.py), in another file than their units (tasks/helpers.py): the watch carries those
    operations from the one to the other."""
    return watch("helper restarts", Watch)


def helper_installed(unit: str, meta: OperationMeta) -> OperationMeta:
    """Watch ``meta``, this host's operation installing the unit of helper ``unit`` (``HELPERS``)
    or the agents' secret (``"secret"``); returns it."""
    return helper_restarts().add(f"{host.name}:{unit}", meta)


def helper_changed(unit: str) -> Callable[[], bool]:
    """For ``_if``: did this run change this host's unit of helper ``unit``, the agents' secret
    (the helpers read it once at start) or a module of the host package's pair job (every helper
    runs it)?"""
    name, restarts, program = host.name, helper_restarts(), hostpkg.changed("pair")
    return lambda: bool(restarts.changed(f"{name}:{unit}", f"{name}:secret")) or program()


def keep_helper_running(on_role: Callable[..., OperationMeta], is_head: bool, unit: str) -> None:
    """Two operations for a sparkrig helper unit (``HELPERS``), named after it (so the log tells
    the helpers apart) and present on every host, acting on the head or the workers alone
    (``on_role``: ``on_head`` or ``on_workers``): (re)start it after its unit, the agents' secret
    or its program changed (``helper_changed``), and keep it enabled and running otherwise."""
    what = HELPERS[unit]
    on_role(
        is_head,
        unit_state_set,
        name=f"Restart {what} after its unit or program changed",
        service=unit,
        running=True,
        enabled=True,
        restarted=True,
        daemon_reload=True,
        _if=helper_changed(unit),
    )
    on_role(
        is_head,
        unit_state_set,
        name=f"Keep {what} enabled and running",
        service=unit,
        running=True,
        enabled=True,
    )
