"""torch's arithmetic functions on Python numbers (``torch.div(n, w, rounding_mode="trunc")``),
and the small constant tensors they make used as sizes, as transformers' Longformer and LED
do: one graph with no break, values and dtypes as eager's (Dynamo: 1 graph / 0 breaks, through
its fake tensors' constant propagation). Before: the op's meta rule refused a call with no
tensor operand ("core.trunc_divide: needs a tensor operand") and the frame ran eagerly."""
import pytest
import torch

import kiln


def one_graph(fn, *args, dynamic=None):
    kiln.reset()
    out = kiln.explain(fn, backend="eager", dynamic=dynamic)(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    want = fn(*args)
    for a, b in zip(out.result, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b)
    return out


@pytest.mark.parametrize("expr", [
    'torch.div(x.size(1), 2, rounding_mode="trunc")',
    'torch.div(x.size(1), 2, rounding_mode="floor")',
    'torch.div(x.size(1), 2)',
    'torch.add(x.size(1), 2)',
    'torch.sub(x.size(1), 2, alpha=2)',
    'torch.mul(3, 2.5)',
    'torch.true_divide(True, 2)',
    'torch.floor_divide(7, 2)',
])
def test_arithmetic_on_numbers_is_eager_0d_tensor(expr):
    ns = {}
    exec(f"def f(x):\n    return x * 2, {expr}", {"torch": torch}, ns)
    one_graph(ns["f"], torch.randn(2, 7))


def chunked_view(x):
    """Longformer's ``_chunk``: the quotient is a size of ``view``."""
    return x.view(x.size(0), torch.div(x.size(1), 2, rounding_mode="trunc"), 2) * 2,


def chunks_of_zeros(x):
    """Longformer's ``chunks_count``: arithmetic on the 0-d tensor, then sizes of new_zeros and
    of as_strided (a fallback node), the size passed by keyword."""
    chunks = torch.div(x.size(1), 2, rounding_mode="trunc") - 1
    zeros = x.new_zeros((x.size(0), chunks + 1, 2))
    ones = x.new_ones(size=x.size())
    strided = x.as_strided(size=(x.size(0), chunks + 1, 2), stride=(x.size(1), 2, 1))
    return zeros + 1, ones, strided * 3


def test_quotient_as_a_view_size():
    one_graph(chunked_view, torch.randn(3, 8))


def test_quotient_arithmetic_as_creation_and_strided_sizes():
    one_graph(chunks_of_zeros, torch.randn(3, 8))


def test_a_changing_size_recompiles_or_stays_right():
    kiln.reset()
    compiled = kiln.compile(chunked_view, backend="eager")
    for n in (8, 10, 12):
        x = torch.randn(3, n)
        torch.testing.assert_close(compiled(x), chunked_view(x))


def symbolic_quotient(x):
    n = torch.div(x.size(1), 2, rounding_mode="trunc")
    return x * n, n, torch.full((), x.size(1))


def test_symbolic_size_operand_is_a_graph_tensor():
    kiln.reset()
    compiled = kiln.compile(symbolic_quotient, backend="eager", dynamic=True)
    for n in (6, 7, 9):
        x = torch.randn(2, n)
        got, want = compiled(x), symbolic_quotient(x)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype, (a.dtype, b.dtype)  # full((), size) is int64, as in eager
            torch.testing.assert_close(a, b)
    assert kiln.stats()["graph_breaks"] == 0


def test_a_parameter_is_never_folded():
    # a small parameter read as a graph constant may change between calls: its ops stay nodes
    lin = torch.nn.Linear(2, 2)
    kiln.reset()
    compiled = kiln.compile(lambda x: lin(x) + lin.bias * 2, backend="eager")
    x = torch.randn(3, 2)
    with torch.no_grad():
        compiled(x)
        lin.bias.add_(1.0)
        torch.testing.assert_close(compiled(x), lin(x) + lin.bias * 2)


def test_flip_dims_keyword():
    def f(x):
        return x.flip(dims=[0]), torch.flip(x, dims=(1,))
    one_graph(f, torch.randn(3, 4))


def test_numbers_where_torch_refuses_them_still_raise_eagers_error():
    def f(x):
        return x + torch.remainder(7, 2)
    kiln.reset()
    with pytest.raises(TypeError):
        kiln.compile(f, backend="eager")(torch.randn(2))
