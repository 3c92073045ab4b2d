"""functools.reduce (it consumes its iterable at once, so each call is traced in order) and
``x.__len__()`` (as ``len(x)``), in one graph, as Dynamo (PyTorch's test_reduce, test_tensor_len)."""
import functools
import operator

import pytest
import torch

import kiln


def one_graph(fn, *args):
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    torch.testing.assert_close(out.result, fn(*args))


def reduced(a, b):
    total = functools.reduce(operator.add, [a, b, a * 2])
    scaled = functools.reduce(lambda acc, t: acc * 0.5 + t, [b, a], torch.ones(3))
    return total + scaled


def lengths(a):
    return a + len(a) + a.__len__()


def test_reduce():
    one_graph(reduced, torch.randn(3), torch.randn(3))


def test_tensor_len():
    one_graph(lengths, torch.randn(4, 2))


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
def test_len_of_a_0d_tensor_raises_eagers_error():
    kiln.reset()
    with pytest.raises(TypeError, match="0-d tensor"):
        kiln.compile(lambda a: a.__len__())(torch.tensor(1.0))
