"""kiln's caches hold no dropped function, model or input alive (issue 24, item 6): the code
cache is keyed weakly, and a capture keeps no tensor of the call it traced."""
import gc
import weakref

import torch
from torch import nn

import kiln
from kiln import api


def _closure():
    big = torch.randn(1 << 12)

    def f(x):
        return x * 2 + big
    return f, weakref.ref(big)


def test_dropped_closures_and_what_they_hold_are_freed():
    refs = []
    for _ in range(5):
        f, big = _closure()
        cf = kiln.compile(f)
        x = torch.randn(1 << 12)
        torch.testing.assert_close(cf(x), f(x))
        refs.append((weakref.ref(f), big))
        del f, cf
    gc.collect()
    gc.collect()  # the resume function's cycle is unreachable only once f's cache entry went
    assert [r for r, b in refs if r() is not None or b() is not None] == []
    assert not any(callable(k) and k.__name__ == "f" for k, _ in api._CODE_CACHES.keys())


def test_dropped_models_are_freed():
    refs = []
    for _ in range(5):
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        cm = kiln.compile(m)
        x = torch.randn(3, 8)
        torch.testing.assert_close(cm(x), m(x))
        refs.append((weakref.ref(m), weakref.ref(m[0].weight)))
        del m, cm
    gc.collect()
    assert [r for r in refs if r[0]() is not None or r[1]() is not None] == []


def test_the_first_input_is_not_pinned_by_the_cache():
    def g(x, y):
        return (x * y).sum(0)

    cg = kiln.compile(g, dynamic=True)  # symbolic sizes: the shape env is kept with the entry
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    torch.testing.assert_close(cg(x, y), g(x, y))
    refs = [weakref.ref(x), weakref.ref(y)]
    del x, y
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    a, b = torch.randn(7, 3), torch.randn(7, 3)
    torch.testing.assert_close(cg(a, b), g(a, b))  # the entry still works
    assert kiln.stats()["frames_compiled"] == 1


def test_dropped_functions_with_graph_breaks_are_freed():
    def make():
        big = torch.randn(64)

        def f(x):
            y = x + big
            print("break")
            return y * 2
        return f, weakref.ref(big)
    refs = []
    for _ in range(3):
        f, big = make()
        cf = kiln.compile(f)
        x = torch.randn(64)
        torch.testing.assert_close(cf(x), f(x))
        refs.append((weakref.ref(f), big))
        del f, cf
    gc.collect()
    gc.collect()  # the resume function's cycle is unreachable only once f's cache entry went
    assert [r for r, b in refs if r() is not None or b() is not None] == []


def test_a_dropped_function_that_ran_eagerly_is_freed():
    import warnings

    f, big = _closure()
    cf = kiln.compile(f, dynamic=False)
    with kiln.config.patch(recompile_limit=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cf(torch.randn(1 << 12))
        cf(torch.randn(1))  # past the limit: noted as an eager run
    assert kiln.stats()["eager_runs"] == 1
    ref = weakref.ref(f)
    del f, cf
    gc.collect()
    assert ref() is None and big() is None
