"""once_per_run under pyinfra's parallel load: one greenlet per host, each may yield in make()."""

import gevent
from pyinfra.context import ctx_host, ctx_state

from sparkrig.runscope import Watch, once_per_run, pair_of, pairs_are, slot, watch


def test_hosts_loading_at_once_share_one_object_even_when_making_it_yields():
    run = object()
    made: list[int] = []

    def make() -> int:
        made.append(len(made))
        gevent.sleep(0.01)  # an SSH read of another host: the other greenlets run meanwhile
        return made[-1]

    jobs = [gevent.spawn(once_per_run, "test slot", run, make) for _ in range(3)]
    gevent.joinall(jobs, raise_error=True)
    assert [job.value for job in jobs] == [0, 0, 0]
    assert made == [0]


def test_a_new_run_gets_a_new_object_and_nesting_other_slots_works():
    first, second = object(), object()
    outer = once_per_run("test outer", first, lambda: once_per_run("test inner", first, list))
    assert once_per_run("test outer", first, dict) is outer
    assert once_per_run("test outer", second, dict) == {}


class _Host:
    def __init__(self, name: str) -> None:
        self.name = name


class _State:
    def __init__(self, inventory: object) -> None:
        self.inventory = inventory


def watcher_of(state: _State, name: str) -> Watch:
    with ctx_state.use(state), ctx_host.use(_Host(name)):
        return watch("test purpose", Watch)


def test_each_pair_of_a_run_gets_its_own_watcher_and_one_cluster_one_for_the_run():
    inventory = object()
    pairs_are(inventory, {"a": "pair_a", "b": "pair_a", "c": "pair_b", "d": "pair_b"})
    state = _State(inventory)
    a, b, c, d = (watcher_of(state, n) for n in "abcd")
    assert a is b and c is d and a is not c
    assert watcher_of(_State(inventory), "a") is not a  # a new run: a new one
    one = object()
    pairs_are(one, {"a": "", "b": ""})
    state = _State(one)
    assert watcher_of(state, "a") is watcher_of(state, "b")
    assert slot("pair restart", "") == "pair restart"  # one cluster: today's slot, unchanged


def test_a_pair_is_looked_up_in_its_own_run_only():
    pairs_are(object(), {"a": "pair_a"})
    assert pair_of("a", object()) == ""
