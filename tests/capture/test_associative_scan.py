"""torch's associative_scan captured as a tree of combine_fn calls (kiln/capture/associative_scan.py):
one graph for elementwise combine functions (Mamba's linear recurrence, a running sum), over
every length's tree shape, reversed, on any dim, with gradients as eager's; a graph break
naming the reason for a combine function that is not elementwise over the batch (a matrix
product, a reduction) or reads its operands' sizes, where the batch would differ from vmap."""
import pytest
import torch
from torch._higher_order_ops.associative_scan import associative_scan

import kiln


def linear_recurrence(left, right):
    """h_t = a_t * h_{t-1} + b_t, as transformers' Mamba writes it."""
    a_left, b_left = left
    a_right, b_right = right
    return a_left * a_right, a_right * b_left + b_right


def states(a, b, dim=2, reverse=False):
    return associative_scan(linear_recurrence, (a, b), dim=dim, combine_mode="generic", reverse=reverse)[1]


def running_sum(x):
    return associative_scan(lambda u, v: u + v, x, dim=0, combine_mode="generic")


def one_graph(fn, *args):
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    torch.testing.assert_close(out.result, fn(*args))
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("reverse", [False, True])
def test_linear_recurrence_one_graph(n, reverse):
    a, b = torch.rand(2, 3, n, 4), torch.randn(2, 3, n, 4)
    one_graph(states, a, b, 2, reverse)


@pytest.mark.parametrize("dim", [0, -1])
def test_running_sum_is_cumsum(dim):
    x = torch.randn(7, 5)
    out = kiln.compile(lambda x: associative_scan(lambda u, v: u + v, x, dim=dim, combine_mode="generic"))(x)
    torch.testing.assert_close(out, torch.cumsum(x, dim))


def test_list_leaves_and_outer_operand():
    """xs as a list (the result is a list too) and a tensor the combine function closes over,
    broadcast from the right as per example."""
    w = torch.rand(4)

    def fn(a, b):
        def combine(left, right):
            return [left[0] * right[0], right[0] * left[1] * w + right[1]]
        return associative_scan(combine, [a, b], dim=1, combine_mode="generic")
    out = one_graph(fn, torch.rand(3, 6, 4), torch.randn(3, 6, 4))
    assert type(out.result) is list


def test_gradients_match_eager():
    a = torch.rand(2, 9, 4, requires_grad=True)
    b = torch.randn(2, 9, 4, requires_grad=True)

    def loss(a, b):
        return states(a, b, dim=1).pow(2).sum()
    want = torch.autograd.grad(loss(a, b), (a, b))
    kiln.reset()
    got = torch.autograd.grad(kiln.compile(loss)(a, b), (a, b))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_probe_leaves_no_nodes():
    """The one-example probe of combine_fn is erased from the graph."""
    out = one_graph(running_sum, torch.randn(4, 3))
    assert not any(getattr(n.target, "name", "") == "select" for n in out.graphs[0].nodes)


def matrix_product(x, y):
    return x @ y


def scaled_by_length(x, y):
    return x * x.shape[0] + y  # under vmap, an example's first size; on the batch, its length


def by_row_sum(x, y):
    return x * y.sum(-1, keepdim=True)


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
@pytest.mark.parametrize("combine,shape,reason", [
    (matrix_product, (6, 3, 3), "core.matmul, which is not elementwise"),
    (by_row_sum, (6, 3), "core.sum, which is not elementwise"),
    (scaled_by_length, (6, 3), "reads its operands' sizes"),
])
def test_not_elementwise_is_a_break(combine, shape, reason):
    def fn(x):
        return associative_scan(combine, x, dim=0, combine_mode="generic")
    x = torch.randn(*shape)
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(x)
    assert out.graph_break_count == 1 and reason in out.break_reasons[0].reason
    torch.testing.assert_close(out.result, fn(x))


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
def test_pointwise_mode_on_cpu_raises_as_eager():
    def fn(x):
        return associative_scan(lambda u, v: u + v, x, dim=0, combine_mode="pointwise")
    with pytest.raises(ValueError, match="CUDA"):
        kiln.compile(fn, backend="eager")(torch.randn(4))
