"""Phase 6, service, 3 of 7: the pair's helpers, for ordered restarts without the control machine:
each worker runs an agent that starts its rank when the head asks (a shared secret that lives with
the pair: sparkrig/pairsecret.py; preflight refused ranks holding different ones); the head gets
`sparkrig-restart-pair`, the pair supervisor and, when the watchdog knob is on, the watchdog that
uses it. The helpers read the secret once at start: a changed secret restarts them, as does a
changed unit or program (sparkrig/helperunits.py ``helper_changed``); the supervisor and the
watchdog are (re)started after the pair's start (tasks/start.py)."""

from pyinfra import inventory

from sparkrig import hostpkg, hoststate
from sparkrig.config.inventory import current, for_inventory
from sparkrig.helperunits import (
    agent_unit_context,
    helper_installed,
    keep_helper_running,
    restart_args,
    role_template,
    supervisor_unit_context,
    watchdog_unit_context,
)
from sparkrig.ordering import on_head, on_workers
from sparkrig.owned import file_absent, secret_installed, unit_state_set
from sparkrig.pairrestart import pair_restart
from sparkrig.pairsecret import pair_secret
from sparkrig.paths import paths
from sparkrig.render import base_context
from sparkrig.secretio import secret_relayed

settings = current()
host_paths = paths(settings)
is_head = settings.me.is_head
head_knobs = for_inventory(inventory)[settings.head.name].knobs  # head-only: the same everywhere
# The stop-together watch and the helpers run the host package's pair job (shipped by the host
# phase): a change to any module that job loads restarts them, a change elsewhere does not.
pair_program = hostpkg.changed("pair")
restart = pair_restart()
agents_secret = pair_secret(settings, hoststate.values)
if agents_secret.known:
    secret = secret_installed(
        name="Install the agents' shared secret",
        text=agents_secret.token + "\n",
        dest=host_paths.pair_token,
    )
else:  # the pair's, known by digest only: a rank lacking it gets a holder's copy at apply time
    lacks = hoststate.read(settings).pair_secret.sha256 != agents_secret.sha256
    secret = secret_relayed(
        name="Install the agents' shared secret",
        source=agents_secret.holder,
        source_path=host_paths.pair_token,
        dest=host_paths.pair_token,
        sha256=agents_secret.sha256,
        _if=lambda: lacks,
    )
helper_installed("secret", secret)
helper_installed(
    "sparkrig-agent",
    role_template(
        on_workers,
        is_head,
        name="Install the worker agent unit",
        template="sparkrig-agent.service.j2",
        context=agent_unit_context(settings),
        dest=host_paths.agent_unit,
    ),
)
keep_helper_running(on_workers, is_head, "sparkrig-agent")
role_template(
    on_head,
    is_head,
    name="Install the ordered pair restart command",
    template="sparkrig-restart-pair.j2",
    context={**base_context(settings), "restart_args": restart_args(settings)},
    dest=host_paths.restart_script,
    mode="755",
)
helper_installed(
    "sparkrig-supervisor",
    role_template(
        on_head,
        is_head,
        name="Install the pair supervisor unit",
        template="sparkrig-supervisor.service.j2",
        context=supervisor_unit_context(settings),
        dest=host_paths.supervisor_unit,
    ),
)
if head_knobs.watchdog:
    helper_installed(
        "sparkrig-watchdog",
        role_template(
            on_head,
            is_head,
            name="Install the watchdog unit",
            template="sparkrig-watchdog.service.j2",
            context=watchdog_unit_context(settings),
            dest=host_paths.watchdog_unit,
        ),
    )
else:
    on_head(
        is_head,
        unit_state_set,
        name="Stop the watchdog while it is switched off",
        service="sparkrig-watchdog",
        running=False,
        enabled=False,
    )
    on_head(
        is_head,
        file_absent,
        name="Remove the watchdog unit while it is switched off",
        path=host_paths.watchdog_unit,
    )

# The stop-together watch runs beside a live rank: a new program reloads the watch (it execs the
# new program keeping its beacon's socket open, so no peer reads it as gone), not the rank.
unit_state_set(
    name="Reload the stop-together watch after its program changed",
    service="sparkrig-pair",
    reloaded=True,
    _if=lambda: pair_program() and not restart(),
)
