"""Tensor item assignment compiles: basic indices write through a view, one index tensor
(int or bool) writes with index_put / a masked where; eager's results and side effects."""
import pytest
import torch

import kiln
from mutation_helpers import check_mutation
from testing import TARGETS, on_target, randn

BACKENDS = ["eager", "aot_eager", "kiln"]


def _r(*shape, dtype=torch.float32, layout="contiguous"):
    return randn(shape, dtype, "cpu", layout)


def basic_indices(x, v):
    x[:, 0] = v                    # select, tensor value
    x[1:3] = 0                     # slice, Python scalar
    x[..., 2] = 1.5                # Ellipsis
    x[::2, 1:] = x[1::2, :-1] * 2  # stepped slices, value read from x itself
    x[0, None, 1:3] = -4.0         # None in the key
    x[-1] = v[:5]                  # negative index
    return x


def tensor_indices(x, m, idx, rows):
    x[m] = -1.0                    # bool mask over the whole tensor
    x[idx] = 7.0                   # int index tensor
    x[idx] = rows                  # int index tensor, a row per index
    x[:, torch.tensor([1, 3])] = 0.25
    return x.sum(0)


def masked_rows(x, rowmask, row):
    x[rowmask] = row               # bool mask over the leading dim, a broadcast row value
    x[..., torch.tensor([0, 2])] = x[..., torch.tensor([1, 3])]
    return x


def of_intermediate(x, v):
    y = x.exp()
    y[:, 1] = v
    z = y[1:]
    z[0, 0] = 100.0                # writes y through z
    return y, z


@pytest.mark.parametrize("backend", BACKENDS)
def test_basic_indices(backend):
    check_mutation(basic_indices, lambda: [_r(6, 5), _r(6)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_indices(backend):
    check_mutation(tensor_indices, lambda: [_r(6, 5), _r(6, 5) > 0, torch.tensor([0, -2]),
                                            _r(2, 5)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_rows(backend):
    check_mutation(masked_rows, lambda: [_r(6, 4), torch.rand(6) > 0.5, _r(4)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_setitem_on_intermediate(backend):
    check_mutation(of_intermediate, lambda: [_r(4, 3), _r(4)], backend)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64])
def test_dtypes(dtype):
    def f(x, v):
        x[1] = v                   # v is float32: cast into x's dtype
        x[:, 0] = 3
        return x * 2
    check_mutation(f, lambda: [_r(3, 4, dtype=dtype), _r(4) * 4], "kiln", dtype=dtype)


def test_noncontiguous_input():
    check_mutation(basic_indices, lambda: [_r(6, 5, layout="transposed"), _r(6)], "kiln")


@pytest.mark.parametrize("target", TARGETS)
def test_targets(target):
    with on_target(target):
        check_mutation(tensor_indices, lambda: [_r(6, 5), _r(6, 5) > 0, torch.tensor([0, 3]),
                                                _r(2, 5)], "kiln", calls=1)


def test_training_through_setitem():
    lin = torch.nn.Linear(4, 4)

    def f(x):
        h = lin(x)
        h[:, 0] = 0.0
        h[1:3] = h[1:3] * 2
        h[torch.tensor([0])] = x[:1] * 3
        return h.square().sum()

    x = _r(4, 4).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    expected = f(x)
    expected.backward()
    wgrad = lin.weight.grad.clone()
    lin.weight.grad = None
    out = kiln.compile(f, fullgraph=True)(x2)
    out.backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x2.grad, x.grad)
    torch.testing.assert_close(lin.weight.grad, wgrad)


def test_data_dependent_assignment_is_a_graph_break():
    def f(x, m, v):
        x[m] = v                   # v has as many elements as m is true: data-dependent
        return x
    x, m = _r(6), torch.tensor([True, False, True, False, False, False])
    x2 = x.clone()
    out = kiln.compile(f)(x2, m, torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(out, f(x, m, torch.tensor([1.0, 2.0])))
    torch.testing.assert_close(x2, x)
    assert kiln.stats()["graph_breaks"] == 1


def test_out_of_range_index_raises_like_eager():
    def f(x):
        x[7] = 1.0
        return x
    with pytest.raises(IndexError):
        kiln.compile(f)(_r(3, 2))
