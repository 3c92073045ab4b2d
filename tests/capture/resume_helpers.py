"""The check every resume test runs: compiled (backends eager and kiln) against plain eager.

``check_break(fn, make_args, graphs=, breaks=)``:
* runs ``fn`` eagerly and compiled on the same fresh inputs; outputs must match, and so must
  the printed text (capsys) and any list the function appends to (``make_args`` returns
  fresh lists every time, and they are compared after the call);
* calls the compiled function again on the same inputs: nothing may compile again, and
  nothing may recompile;
* calls it on fresh random inputs: the result must match eager again (no recompiles unless
  ``specializes`` says the function specializes on data, like ``.item()``; the first call
  may recompile a resume function that starts inside a loop, once per distinct iteration);
* asserts the graph and break counts that ``kiln.explain`` reports.
"""
from __future__ import annotations

import collections

import torch

import kiln

BACKENDS = ["eager", "kiln"]


def _clone(v):
    if isinstance(v, torch.Tensor):
        c = v.detach().clone()
        c.requires_grad_(v.requires_grad)
        return c
    if isinstance(v, list):
        return [_clone(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_clone(x) for x in v)
    if type(v) is collections.OrderedDict:
        return collections.OrderedDict((k, _clone(x)) for k, x in v.items())
    if isinstance(v, dict):
        return {k: _clone(x) for k, x in v.items()}
    return v


def assert_same(actual, expected):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), (type(actual), expected)
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        assert actual.requires_grad == expected.requires_grad
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), (actual, expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected)
        for k in expected:
            assert_same(actual[k], expected[k])
    elif isinstance(expected, float):
        assert abs(actual - expected) <= 1e-4 * max(1.0, abs(expected)), (actual, expected)
    else:
        assert actual == expected, (actual, expected)


def run_both(fn, compiled, args, capsys):
    eager_args, compiled_args = _clone(args), _clone(args)
    capsys.readouterr()
    expected = fn(*eager_args)
    eager_text = capsys.readouterr().out
    actual = compiled(*compiled_args)
    compiled_text = capsys.readouterr().out
    assert compiled_text == eager_text
    assert_same(actual, expected)
    assert_same(list(compiled_args), list(eager_args))  # appended lists, mutated inputs
    return actual, expected


def check_break(fn, make_args, capsys, backend, *, graphs, breaks, specializes=False):
    compiled = kiln.compile(fn, backend=backend)
    run_both(fn, compiled, make_args(), capsys)
    first = kiln.stats()["recompiles"]  # a break inside a loop: one entry per distinct iteration
    args = make_args()
    run_both(fn, compiled, args, capsys)
    stats = kiln.stats()
    if not specializes:
        assert stats["recompiles"] == first, stats
    compiled_before = stats["frames_compiled"]
    run_both(fn, compiled, args, capsys)  # the very same inputs: every frame is a cache hit
    stats = kiln.stats()
    assert stats["frames_compiled"] == compiled_before, stats
    assert stats["cache_hits"] > 0, stats
    if backend == "eager":
        explained = kiln.explain(fn, backend="eager")(*_clone(make_args()))
        capsys.readouterr()
        got = (explained.graph_count, explained.graph_break_count)
        assert got == (graphs, breaks), f"{got} != {(graphs, breaks)}\n{explained}"
        assert len(explained.ops_per_graph) == graphs
        for b in explained.break_reasons:
            assert b.reason and b.filename and b.lineno and b.source_line, b
    return compiled


def randn(*shape, grad=False):
    t = torch.randn(*shape)
    return t.requires_grad_(grad)
