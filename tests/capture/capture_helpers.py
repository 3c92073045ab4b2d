"""Shared checks for the capture tests: trace, run the graph, compare with eager."""
import inspect

import torch

from kiln.capture import frame_locals, trace
from kiln.graph import verify


def locals_for(fn, args, kwargs=None):
    return frame_locals(fn, tuple(args), dict(kwargs or {}))


def run_captured(result, fn, args, kwargs=None):
    L = locals_for(fn, args, kwargs)
    assert result.guard_fn(L, _globals(fn)), result.guard_source
    inputs = result.fetch(L)
    assert len(inputs) == len(result.graph.placeholders)
    out = result.rebuild(result.graph.run(*inputs))
    # The printout is runnable and computes the same thing.
    printed = result.graph.as_function()(*inputs)
    torch.testing.assert_close(printed, result.graph.run(*inputs))
    return out


def _globals(fn):
    return getattr(fn, "__func__", fn).__globals__


def check(fn, make_args, kwargs=None):
    """Trace fn on make_args(); compare the graph with eager there and on fresh random inputs."""
    kwargs = dict(kwargs or {})
    args = tuple(make_args())
    result = trace(fn, args, kwargs)
    verify(result.graph)
    torch.testing.assert_close(run_captured(result, fn, args, kwargs), fn(*args, **kwargs))
    fresh = tuple(make_args())
    torch.testing.assert_close(run_captured(result, fn, fresh, kwargs), fn(*fresh, **kwargs))
    return result


def sig_names(fn):
    return list(inspect.signature(fn).parameters)
