"""Phase 6, service, 1 of 7: the API key (knob api_auth). It lives with the head, like the agents'
secret (sparkrig/pairsecret.py): the head's installed key wins, the control side's copy
(api_key_file) is used only when the head has none, a new one is made only when neither has one or
on request (api_key_rotate). On the head 0600 root twice: the key alone for the gates and the
watchdog's probe, and the docker env file that gives it to vLLM as VLLM_API_KEY (in no unit file, no
argv, no `ps`). A new key restarts the pair (vLLM reads it at start). The control side gets a copy
of the head's key when it lacks it, for the clients. Without the head in the run (--limit worker)
nothing about the key is decided. Off: both files go and the rank unit loses its --env-file.
Several pairs behind one endpoint share one key: every pair's head holds it (decided once for all
of them), and the endpoint's first head in the run writes the control side's copy."""

from pyinfra import host, inventory
from pyinfra.operations import python

from sparkrig import hoststate
from sparkrig.config.inventory import current, for_inventory
from sparkrig.ordering import in_this_run, on_head
from sparkrig.owned import file_absent, secret_installed
from sparkrig.pairrestart import pair_restart
from sparkrig.pairsecret import api_key, control_token, write_control_copy_later
from sparkrig.paths import paths
from sparkrig.serving import api_key_env

settings = current()
host_paths = paths(settings)
is_head = settings.me.is_head
head_knobs = for_inventory(inventory)[settings.head.name].knobs  # head-only: the same everywhere
api = api_key(settings, hoststate.values)  # the endpoint's: one for every pair's head
# the control side's one copy is written by one head, the endpoint's first in the run
heads_in_run = [h.name for h in settings.pair_heads if in_this_run(h.name)]
keeps_copy = is_head and heads_in_run[:1] in ([], [settings.me.name])
if head_knobs.api_auth and api is not None and api.sha256:
    # A key the control side lacks is the head's own, judged by digest (its files stay as they
    # are; a lost env file was refused at preflight): never read back, except once at apply
    # time for the clients' copy below (sparkrig/secretio.py).
    if api.known:
        on_head(
            is_head,
            secret_installed,
            name="Install the API key",
            text=api.token + "\n",
            dest=host_paths.api_key,
        )
        key_env = on_head(
            is_head,
            secret_installed,
            name="Install the API key env file for vLLM",
            text=api_key_env(api.token),
            dest=host_paths.api_key_env,
        )
        pair_restart().trigger("api_key", key_env)
    if not api.known or control_token(head_knobs.api_key_file) != api.token:
        on_head(
            keeps_copy,
            python.call,
            name="Keep a copy of the head's API key on the control machine",
            function=write_control_copy_later(
                head_knobs.api_key_file, api.token, api.holder, host_paths.api_key, api.sha256
            ),
        )
elif not head_knobs.api_auth:
    for path in host.loop([host_paths.api_key, host_paths.api_key_env]):
        on_head(
            is_head,
            file_absent,
            name="Remove the API key while api_auth is off",
            path=path,
        )
