"""Graph outputs have eager's strides, as torch.compile guarantees.

A pointwise result on a channels-last input is channels-last in eager, so a later
``as_strided`` (or a layout-dependent view) reads by those strides. Each case compares the
compiled output's strides (on dims of size > 1, where a stride means something), its values,
and what ``as_strided`` over its storage reads, with eager's, on every backend.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.meta.strides import pointwise_strides
from kiln.meta.tensor_meta import TensorMeta

BACKENDS = ["eager", "aot_eager", "kiln"]


def cl(*shape):
    return torch.randn(*shape).to(memory_format=torch.channels_last)


def tr(n, m):
    return torch.randn(m, n).t()


CASES = {
    "pointwise_channels_last": (lambda x: x * 2 + 1, lambda: (cl(2, 3, 4, 5),)),
    "unary_channels_last": (lambda x: torch.relu(x).exp(), lambda: (cl(2, 3, 4, 5),)),
    "to_dtype_channels_last": (lambda x: (x * 2).half(), lambda: (cl(2, 3, 4, 5),)),
    "pointwise_transposed": (lambda x: x.sin(), lambda: (tr(6, 5),)),
    "binary_transposed": (lambda x, y: x + y, lambda: (tr(6, 5), tr(6, 5))),
    "broadcast_mixed_layouts": (lambda x, y: x * y, lambda: (cl(2, 3, 4, 5), torch.randn(3, 1, 1))),
    "broadcast_contiguous_first": (lambda x, y: x - y, lambda: (torch.randn(4, 5), torch.randn(1, 5).expand(4, 5))),
    "mixed_first_wins": (lambda x, y: x + y, lambda: (cl(2, 3, 4, 5), torch.randn(2, 3, 4, 5))),
    "mixed_contiguous_first": (lambda x, y: x + y, lambda: (torch.randn(2, 3, 4, 5), cl(2, 3, 4, 5))),
    "where_channels_last": (lambda x: torch.where(x > 0, x, x * 0.1), lambda: (cl(2, 3, 4, 5),)),
    "sum_keepdim_channels_last": (lambda x: x.sum(1, keepdim=True), lambda: (cl(2, 3, 4, 5),)),
    "mean_keepdim_channels_last": (lambda x: x.mean((2, 3), keepdim=True), lambda: (cl(2, 3, 4, 5),)),
    "amax_channels_last": (lambda x: x.amax(1), lambda: (cl(2, 3, 4, 5),)),
    "repeat": (lambda x: x.repeat(2, 3), lambda: (torch.randn(3, 4),)),
    "repeat_new_dims": (lambda x: x.repeat(2, 1, 1, 3), lambda: (torch.randn(1, 4, 1),)),
    "repeat_of_expanded": (lambda x: x.repeat(3, 1), lambda: (torch.randn(1, 4).expand(2, 4),)),
    "repeat_ones_of_transposed": (lambda x: x.repeat(1, 1), lambda: (tr(3, 4),)),
    "repeat_channels_last": (lambda x: x.repeat(1, 2, 1, 1), lambda: (cl(2, 3, 4, 5),)),
    "repeat_transposed": (lambda x: (x * 2).repeat(2, 2), lambda: (tr(3, 4),)),
    "expand_contiguous": (lambda x: x.expand(3, 4).contiguous(), lambda: (torch.randn(3, 1),)),
    "expand_contiguous_computed": (lambda x: (x + 1).expand(2, 3, 4).contiguous(), lambda: (torch.randn(3, 4),)),
    "permute_output": (lambda x: (x * 2).permute(2, 0, 1), lambda: (torch.randn(2, 3, 4),)),
    "transpose_output": (lambda x: (x + 1).t(), lambda: (torch.randn(3, 5),)),
    "permute_channels_last": (lambda x: (x + 1).permute(0, 2, 3, 1), lambda: (cl(2, 3, 4, 5),)),
    "cat_channels_last": (lambda x, y: torch.cat([x * 1, y * 1], 1), lambda: (cl(2, 3, 4, 5), cl(2, 2, 4, 5))),
    "cat_mixed": (lambda x, y: torch.cat([x * 1, y * 1], 1), lambda: (cl(2, 3, 4, 5), torch.randn(2, 2, 4, 5))),
    "clone_transposed": (lambda x: x.clone(), lambda: (tr(3, 4),)),
    "clone_channels_last": (lambda x: (x * 1).clone(), lambda: (cl(2, 3, 4, 5),)),
    "contiguous_of_channels_last": (lambda x: (x * 2).contiguous(), lambda: (cl(2, 3, 4, 5),)),
    "mm_then_pointwise": (lambda a, b: (a @ b).t() + 1, lambda: (torch.randn(3, 4), torch.randn(4, 5))),
}


def _check(got, expected, name):
    assert got.shape == expected.shape, name
    meaningful = [d for d in range(got.dim()) if got.shape[d] > 1]
    assert [got.stride(d) for d in meaningful] == [expected.stride(d) for d in meaningful], \
        f"{name}: strides {got.stride()}, eager {expected.stride()}"
    torch.testing.assert_close(got, expected)
    # the layout is visible: a flat as_strided read of the storage must match eager's
    n = got.numel()
    flat = lambda t: t.as_strided((n,), (1,), t.storage_offset())  # noqa: E731
    if expected.is_contiguous() or expected.is_contiguous(memory_format=torch.channels_last):
        torch.testing.assert_close(flat(got), flat(expected))
    # strides stay inside the storage
    extent = sum((s - 1) * st for s, st in zip(got.shape, got.stride())) + 1 if n else 0
    assert got.storage_offset() + extent <= got.untyped_storage().nbytes() // got.element_size(), name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_output_strides_match_eager(name, backend):
    fn, make = CASES[name]
    args = make()
    expected = fn(*args)
    got = kiln.compile(fn, backend=backend)(*args)
    _check(got, expected, name)
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graph_breaks"] == 0


@pytest.mark.parametrize("name", ["pointwise_channels_last", "broadcast_mixed_layouts", "permute_output",
                                  "clone_transposed", "cat_channels_last"])
def test_training_outputs_have_eager_strides(name):
    fn, make = CASES[name]
    args = [a.detach().requires_grad_() for a in make()]
    expected = fn(*args)
    got = kiln.compile(fn)(*args)
    _check(got.detach(), expected.detach(), name)
    got.sum().backward()


def test_as_strided_after_a_channels_last_pointwise():
    """The issue's case: an as_strided of the compiled result reads by its strides."""
    x = cl(1, 3, 4, 5)
    got, expected = kiln.compile(lambda x: x * 2)(x), x * 2
    torch.testing.assert_close(got.as_strided((2, 3), (1, 2)), expected.as_strided((2, 3), (1, 2)))


@pytest.mark.parametrize("seed", range(200))
def test_pointwise_stride_rule_matches_torch(seed):
    """TensorIterator's layout rule on random layouts, broadcasts and expanded dims."""
    g = torch.Generator().manual_seed(seed)
    r = lambda n: int(torch.randint(n, (1,), generator=g))  # noqa: E731
    nd = 1 + r(4)
    shape = [1 + r(4) for _ in range(nd)]

    def layout(shape):
        perm = torch.randperm(len(shape), generator=g).tolist()
        t = torch.empty([shape[p] for p in perm]).permute(*[perm.index(i) for i in range(len(shape))])
        if len(shape) > 1 and r(3) == 0:
            d = r(len(shape))
            t = t.narrow(d, 0, 1).expand(*t.shape)
        return t
    a = layout(shape)
    bshape = [1 if r(3) == 0 else s for s in shape][r(nd):]
    b = layout(bshape)
    out = a + b
    got = pointwise_strides(out.shape, [TensorMeta.of(a), TensorMeta.of(b)])
    meaningful = [d for d in range(out.dim()) if out.shape[d] > 1]
    assert [got[d] for d in meaningful] == [out.stride(d) for d in meaningful], \
        (a.shape, a.stride(), b.shape, b.stride(), out.stride(), got)
