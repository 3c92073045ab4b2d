"""Fallback nodes whose arguments hold tensors inside a list or tuple (torch.column_stack's
list, torch.index_put's tuple of an index tensor and a bool mask, whose count is data): the wrapper realizes and passes every
tensor of the list, and the result matches eager on each target."""
import pytest
import torch

import kiln
from kiln.capture import trace
from kiln.ops import core
from testing import TARGETS, assert_close, on_target


def _fallbacks(fn, args):
    graph = trace(fn, args).graph
    return [n.args[0] for n in graph.calls if n.target is core.fallback]


def column_stack(a, b, c):
    return torch.column_stack([a * 2, b.t(), c]) + 1


def index_put_two(x, i, m, v):
    return torch.index_put(x * 2, (i, m), v + 1) - 1


def _column_args(device):
    return (torch.randn(5, 3, device=device), torch.randn(2, 5, device=device),
            torch.randn(5, device=device))


def _index_args(device):
    x = torch.randn(4, 6, device=device)
    i = torch.tensor([0, 3, 1], device=device)
    m = torch.tensor([True, False, True, False, False, True], device=device)
    return x, i, m, torch.randn(3, device=device)


@pytest.mark.parametrize("fn,make", [(column_stack, _column_args), (index_put_two, _index_args)],
                         ids=["column_stack", "index_put_two"])
def test_fallback_taking_tensor_list(fn, make):
    assert _fallbacks(fn, make("cpu")), "the op should stay a fallback node for this test"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn,make", [(column_stack, _column_args), (index_put_two, _index_args)],
                         ids=["column_stack", "index_put_two"])
def test_fallback_tensor_list_matches_eager(fn, make, target):
    with on_target(target) as device:
        args = make(device)
        expected = fn(*args)
        actual = kiln.compile(fn, fullgraph=True)(*args)
    assert kiln.stats()["graph_breaks"] == 0
    assert_close(actual, expected)
    assert actual.shape == expected.shape
