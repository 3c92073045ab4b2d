"""Advanced indexing in one mechanism (kiln/capture/torch_api_index.py): index tensors mixed
with ints, None and partial slices, on dims apart or together, read and written, and
aten.index_put_ with several indices, None entries and bool masks (PyTorch's
test_torchinductor test_index3, test_index_put1/3, test_index_put_as_masked_fill,
test_index_put_fallback1/2, test_remove_noop_clone). Every case matches eager, compiled with
fullgraph=True (so none of it runs eagerly), on fresh random inputs, contiguous or not."""
import pytest
import torch

import kiln
from kiln.capture import trace
from kiln.ops import core
from mutation_helpers import check_mutation
from testing import randn


def _r(*shape, dtype=torch.float32, layout="contiguous"):
    return randn(shape, dtype, "cpu", layout)


def _perm(n, k):
    return torch.randperm(n)[:k]


READS = {
    "int_none_apart": lambda x, i, j: x[:, i, None, j, 0],       # torch's dims-apart rule
    "select_first": lambda x, i, j: x[0, i, :, j],
    "ellipsis_between": lambda x, i, j: x[i, ..., j],
    "partial_slice": lambda x, i, j: x[1:, i, j] * 2,
    "list_and_tensor": lambda x, i, j: x[:, [2, 0, 1], 1:3, j],
    "broadcast_2d": lambda x, i, j: x[i[:, None], :, j[None, :]],
}


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("name", sorted(READS))
def test_mixed_reads_match_eager(name, dtype, layout):
    fn = READS[name]
    compiled = kiln.compile(fn, fullgraph=True)
    for _ in range(2):
        x = _r(3, 4, 4, 4, 3, dtype=dtype, layout=layout)
        i, j = _perm(3, 3) - 1, _perm(3, 3).to(torch.int32)   # a negative index, an int32 one
        expected, actual = fn(x, i, j), compiled(x, i, j)
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected)


def test_mixed_read_gradient():
    def f(x, i, j):
        return (x[:, i, None, j, 0] * 3).sum()
    x = _r(3, 4, 4, 4, 3).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    i, j = torch.tensor([0, 2, 2]), torch.tensor([3, -1, 0])   # a repeated index: grads add
    f(x, i, j).backward()
    kiln.compile(f, fullgraph=True)(x2, i, j).backward()
    torch.testing.assert_close(x2.grad, x.grad)


def swap_columns(x):
    y = x.clone().reshape(-1, 4)
    y[:, [2, 0]] = y[:, [0, 2]]          # a list of ints on the right and the left
    return y + x.reshape(-1, 4)


def write_mixed(x, i, j, v):
    x[:, i, None, j, 0] = 5.0            # dims apart, a scalar
    x[i, :, j] = v                       # dims apart, a value per index
    x[1:, [0, 3], 2] = x[:2, [1, 2], 0]  # partial slice, list, int
    return x


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_list_index_assignment(layout):
    check_mutation(swap_columns, lambda: [_r(2, 4, layout=layout)], "kiln")


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_mixed_assignment(layout):
    check_mutation(write_mixed, lambda: [_r(3, 4, 4, 4, 3, layout=layout), _perm(3, 2),
                                         _perm(4, 2), _r(2, 4, 4, 3)], "kiln")


def aten_put_with_none(a, b, c):
    torch.ops.aten.index_put_(a, (None, b, None), c)
    a1 = a + 1
    torch.ops.aten.index_put_(a1, (None, b + 1, None), c + 1)
    return a, a1


def put_two(a, i, j, v, acc):
    return torch.index_put(a, (i, j), v, accumulate=acc), torch.index_put_(a * 2, [i[1:]], v[:1, None])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_index_put_with_none_entries(dtype):
    check_mutation(aten_put_with_none, lambda: [_r(16, 4, 2, dtype=dtype), _perm(3, 3),
                                                _r(16, 1, 2, dtype=dtype)], "kiln", dtype=dtype)


@pytest.mark.parametrize("acc", [False, True])
def test_index_put_several_indices(acc):
    # repeated pairs only with accumulate (each adds); a plain put with repeated indices is
    # left to its own test (which value wins)
    def make():
        i = torch.tensor([0, 0, 3]) if acc else torch.tensor([0, 1, 3])
        return [_r(4, 5), i, torch.tensor([1, 1, -1]), _r(3), acc]
    check_mutation(put_two, make, "kiln")
    graph = trace(put_two, make()).graph
    assert not [n for n in graph.calls if n.target is core.fallback]


def masked_put(a, m, v, acc):
    a = a.clone()
    torch.ops.aten.index_put_(a, [m], v, acc)
    return a


@pytest.mark.parametrize("acc", [False, True])
def test_bool_mask_put_with_one_value(acc):
    check_mutation(masked_put, lambda: [_r(32, 4, 2), _r(32, 4, 2) > 0, _r(), acc], "kiln")
    check_mutation(masked_put, lambda: [_r(8, 3), torch.rand(8) > 0.5, _r(3), acc], "kiln")


def test_data_dependent_puts_are_library_calls():
    """A mask written with one value per true element, and a mask mixed with an index tensor,
    depend on the mask's count: each stays a fallback node (a library call inside the compiled
    graph), never a graph break."""
    def mixed(a, b, c, d, e):
        a = a.clone()
        torch.ops.aten.index_put_(a, [None, b, c], d, e)
        return a
    for acc in (False, True):
        check_mutation(masked_put, lambda: [_r(3), torch.tensor([True, True, False]), _r(2), acc],
                       "kiln")
        check_mutation(mixed, lambda: [_r(1, 2, 3), torch.tensor([0, 1]),
                                       torch.tensor([True, True, False]), _r(), acc], "kiln")
    assert kiln.stats()["graph_breaks"] == 0
