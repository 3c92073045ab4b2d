"""Threads racing a compiled function's first call (issue 24, item 7): one compile per key, the
other threads wait for it and run its entry."""
import threading

import torch
from torch import nn

import kiln


def _race(fn, make_args, n=8):
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def work(i):
        args = make_args(i)
        barrier.wait()
        try:
            results[i] = (args, fn(*args))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def _f(x, y):
    return (x * y).relu() + x.sin()


def test_eight_threads_racing_the_first_call_compile_once():
    cf = kiln.compile(_f)
    results = _race(cf, lambda i: (torch.randn(6, 5), torch.randn(6, 5)))
    for (x, y), out in results:
        torch.testing.assert_close(out, _f(x, y))
    stats = kiln.stats()
    assert stats["frames_compiled"] == 1 and stats["recompiles"] == 0, stats
    assert stats["eager_runs"] == 0


def test_threads_racing_a_module_compile_once():
    m = nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 3))
    cm = kiln.compile(m)
    with torch.no_grad():
        results = _race(cm, lambda i: (torch.randn(4, 5),))
        for (x,), out in results:
            torch.testing.assert_close(out, m(x))
    assert kiln.stats()["frames_compiled"] == 1


def test_threads_with_two_shapes_compile_each_once():
    cf = kiln.compile(_f, dynamic=False)
    results = _race(cf, lambda i: (torch.randn(3 + i % 2, 4), torch.randn(3 + i % 2, 4)))
    for (x, y), out in results:
        torch.testing.assert_close(out, _f(x, y))
    assert kiln.stats()["frames_compiled"] == 2, kiln.stats()
