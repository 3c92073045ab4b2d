"""Runs every corpus case (see __init__.py): eager backend, kiln backend, explain counts."""
import copy
import dataclasses

import pytest
import torch

import kiln
from kiln import counters

from corpus import load_all
from testing import TOLERANCES

CASES = load_all()


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.detach().clone().requires_grad_(v.requires_grad)
    if isinstance(v, (list, tuple)) and type(v) in (list, tuple):
        return type(v)(_clone(x) for x in v)
    if type(v) is dict:
        return {k: _clone(x) for k, x in v.items()}
    if hasattr(v, "__dict__") and not isinstance(v, (torch.nn.Module, type)) and not callable(v):
        return copy.deepcopy(v)  # plain objects the case may mutate
    return v


def _same(actual, expected, dtype, where="output"):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: {type(actual).__name__}, want a tensor"
        rtol, atol = TOLERANCES.get(dtype or expected.dtype, (0, 0))
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{where}: {m}")
        assert actual.requires_grad == expected.requires_grad, where
        return
    assert type(actual) is type(expected), f"{where}: {type(actual).__name__} != {type(expected).__name__}"
    if dataclasses.is_dataclass(expected):
        for f in dataclasses.fields(expected):
            _same(getattr(actual, f.name), getattr(expected, f.name), dtype, f"{where}.{f.name}")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), where
        for k in expected:
            _same(actual[k], expected[k], dtype, f"{where}[{k!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            _same(a, e, dtype, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def _run_sequence(case, fn, calls):
    outs, states = [], []
    for call in calls:
        args, kwargs = _clone(call.args), _clone(call.kwargs)
        outs.append(fn(*args, **kwargs))
        states.append(copy.deepcopy(case.state(fn)) if case.state else None)
    return outs, states


@pytest.mark.parametrize("backend", ["eager", "kiln"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name, backend):
    case = CASES[name]
    torch.manual_seed(0)
    calls = [case.make_call(i) for i in range(len(case.calls))]
    ref = case.build()
    expected, expected_states = _run_sequence(case, ref, calls)
    target = case.build()
    compiled = kiln.compile(target, backend=backend)
    before = counters.snapshot()
    state_of = (lambda _: case.state(target)) if case.state else None
    actual, actual_states = _run_sequence(dataclasses.replace(case, state=state_of), compiled, calls)
    for i, (a, e) in enumerate(zip(actual, expected)):
        _same(a, e, case.dtype, f"{name} call {i}")
    for i, (a, e) in enumerate(zip(actual_states, expected_states)):
        _same(a, e, case.dtype, f"{name} state after call {i}")
    after = counters.snapshot()
    compiles = after["frames_compiled"] - before["frames_compiled"]
    breaks = after["graph_breaks"] - before["graph_breaks"]
    want = case.compiles if case.compiles is not None else case.graphs
    assert (compiles, breaks) == (want, case.breaks), f"compiles/breaks of {name}"
    if backend == "eager":
        # explain compiles afresh on the first call's inputs (a fresh object: its own state)
        first = calls[0]
        out = kiln.explain(case.build(), backend="eager")(*_clone(first.args), **_clone(first.kwargs))
        assert (out.graph_count, out.graph_break_count) == (case.graphs, case.breaks), str(out)
