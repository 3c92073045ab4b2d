"""Unsupported: raised with the reason and the exact source line."""
import inspect

import pytest
import torch

from kiln.capture import Unsupported, trace


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return start + i
    raise AssertionError(text)


def raises_at(fn, args, text, match):
    with pytest.raises(Unsupported, match=match) as info:
        trace(fn, args, {})
    e = info.value
    assert e.lineno == _line_of(fn, text), str(e)
    assert e.filename == __file__
    assert e.source_line == text
    assert f":{e.lineno}: {text}" in str(e) and "(graph break)" in str(e)
    return e


def test_print():
    def fn(x):
        y = x + 1
        print(y)
        return y

    e = raises_at(fn, (torch.randn(4, 8),), "print(y)", "call to print is not supported")
    assert str(e).startswith("call to print is not supported (graph break) at ")
    # the interpreter state at the break is recorded, for resume functions later
    state = e.frames[-1]
    assert state.code is fn.__code__ and state.lineno == e.lineno
    assert "y" in state.locals


def test_unknown_torch_function():
    # cumsum and friends become fallback nodes (test_capture_fallback.py); nonzero cannot,
    # because its output shape depends on the data
    def fn(x):
        return torch.nonzero(x)

    raises_at(fn, (torch.randn(4, 8),), "return torch.nonzero(x)", "torch.nonzero")


def test_data_dependent_branch():
    def fn(x):
        if x.sum() > 0:
            return x
        return -x

    raises_at(fn, (torch.randn(4, 8),), "if x.sum() > 0:", "data-dependent branch")


def test_branch_on_tensor_value():
    def fn(x):
        y = x * 2
        if y > 0:
            return y
        return -y

    raises_at(fn, (torch.randn(1),), "if y > 0:", "data-dependent branch")


def test_break_inside_helper_reports_helper_line():
    def helper(t):
        return t.nonzero()

    def fn(x):
        return helper(x) + 1

    e = raises_at(helper, (torch.randn(4, 8),), "return t.nonzero()", "Tensor.nonzero")
    with pytest.raises(Unsupported) as info:
        trace(fn, (torch.randn(4, 8),), {})
    assert info.value.lineno == e.lineno
    assert [s.code for s in info.value.frames] == [fn.__code__, helper.__code__]


def test_store_attr_and_input_mutation():
    class Box:
        pass

    box = Box()

    def store(x):
        box.value = x
        return x

    # attribute writes are replayed after the graph runs (corpus/mutation.py has the cases)
    import kiln
    x = torch.randn(4, 8)
    kiln.compile(store, backend="eager")(x)
    assert box.value is x

    def mutate(x):  # in-place ops compile (test_inplace.py); this write is data-dependent
        x[x > 0] = x[:2]
        return x

    raises_at(mutate, (torch.randn(4, 8),), "x[x > 0] = x[:2]", "data-dependent")


def test_shape_mismatch_is_unsupported_not_a_crash():
    def fn(x, y):
        return x + y

    with pytest.raises(Unsupported, match="operator \\+"):
        trace(fn, (torch.randn(4, 8), torch.randn(3, 8)), {})
