"""Under ``fullgraph=True``, a step capture knows eager refuses (``errors.EagerRaises``) gives
the user eager's own exception, as an op whose meta refused its arguments does, instead of
kiln's ``GraphBreakError``: the call runs eagerly and raises from the user's line. Without
``fullgraph`` it stays a graph break whose eager half raises the same exception."""
import pytest
import torch

import kiln


def as_float(x):
    return float(x + 1)


def as_int(x):
    return int(x * 2)


def as_bool(x):
    return x + 1 if x else x - 1


def grad_on_ints(x):
    y = torch.arange(3)
    with torch.no_grad():
        y.requires_grad_()
    return x + y


def expanded_write(x):
    y = x.expand(3, 3)
    y.add_(1)
    return y


CASES = [
    (as_float, lambda: torch.tensor([1.0, 2.0]), ValueError, "only one element tensors"),
    (as_int, lambda: torch.tensor([1, 2]), ValueError, "only one element tensors"),
    (as_bool, lambda: torch.tensor([1.0, 2.0]), RuntimeError, "more than one value is ambiguous"),
    (grad_on_ints, lambda: torch.ones(3), RuntimeError, "floating point"),
    (expanded_write, lambda: torch.ones(3), RuntimeError, "more than one element"),
]


@pytest.mark.parametrize("fn, make, error, text", CASES, ids=[c[0].__name__ for c in CASES])
def test_fullgraph_raises_eagers_error(fn, make, error, text):
    with pytest.raises(error, match=text):
        fn(make())
    kiln.reset()
    compiled = kiln.compile(fn, fullgraph=True, dynamic=False)
    with pytest.raises(error, match=text) as caught:
        compiled(make())
    assert not isinstance(caught.value, kiln.GraphBreakError)


def test_one_element_still_compiles_in_one_graph():
    kiln.reset()
    compiled = kiln.compile(as_float, fullgraph=True, dynamic=False)
    assert compiled(torch.tensor([2.0])) == as_float(torch.tensor([2.0]))


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
def test_without_fullgraph_it_is_a_break_raising_the_same():
    kiln.reset()
    compiled = kiln.compile(as_float)
    with pytest.raises(ValueError, match="only one element tensors"):
        compiled(torch.tensor([1.0, 2.0]))
    assert kiln.stats()["graph_breaks"] >= 1
