"""once_per_run under pyinfra's parallel load: one greenlet per host, each may yield in make()."""

import gevent

from sparkrig.runscope import once_per_run


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
