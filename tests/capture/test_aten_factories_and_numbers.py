"""Ops with no tensor argument (issue 24 peer cases ``test_empty_strided``, ``test_index_tensor``,
``test_both_scalars``, ``test_div8``): each was "has no tensor argument" and ran eagerly.

- ``torch.empty_strided`` / ``aten.empty_strided`` / ``Tensor.new_empty_strided``: a graph
  value with exactly those strides (a buffer in stride order, padded and sliced where the strides
  leave gaps);
- ``prims.iota``: an arange;
- an aten op on Python numbers only (``aten.add(4, 3.3)``): run at trace time on the
  specialized numbers, as torch would pick the overload, a constant of the graph.
"""
from __future__ import annotations

import pytest
import torch

import kiln

aten = torch.ops.aten


def _check(fn, *args):
    kiln.reset()
    got, want = kiln.compile(fn, fullgraph=True)(*args), fn(*args)
    assert kiln.stats()["eager_runs"] == 0 and kiln.stats()["frames_compiled"] == 1
    return got, want


@pytest.mark.parametrize("size,stride", [((1, 128, 128), (16384, 128, 1)), ((3, 4, 5), (1, 15, 3)),
                                         ((16, 8), (16, 1)), ((2, 1, 3), (1, 7, 2)), ((4,), (1,))])
def test_empty_strided_has_those_strides(size, stride):
    got, want = _check(lambda: (torch.empty_strided(size, stride).fill_(1),
                                aten.empty_strided(list(size), list(stride))))
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
    significant = [d for d in range(len(size)) if size[d] > 1]
    assert [got[1].stride(d) for d in significant] == [stride[d] for d in significant]
    assert torch.equal(got[0], want[0])


def test_empty_strided_like_a_strided_input_takes_its_values():
    def fn(x):
        out = torch.empty_strided(x.size(), x.stride(), device=x.device)
        out[:] = x + x
        return out, aten.new_empty_strided(x, [2, 3], [1, 2]).fill_(0) + 1
    full = torch.randn(16, 16)
    got, want = _check(fn, torch.as_strided(full, (16, 8), full.stride()))
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_overlapping_strides_are_a_break_not_an_error():
    fn = lambda x: torch.empty_strided((3, 4), (1, 1)).fill_(2) + x  # noqa: E731
    with pytest.raises(kiln.GraphBreakError, match="overlap"):
        kiln.compile(fn, fullgraph=True)(torch.randn(3, 4))
    kiln.reset()
    assert torch.equal(kiln.compile(fn)(torch.ones(3, 4)), fn(torch.ones(3, 4)))


def test_prims_iota_indexes():
    def fn(x, y):
        last = aten.sub.Tensor(aten.sum.dim_IntList(aten.ne.Scalar(x, 0), [-1]), 1)
        iota = torch.ops.prims.iota.default(1, start=0, step=1, dtype=torch.int64, device=x.device,
                                            requires_grad=False)
        stepped = torch.ops.prims.iota(5, start=3, step=-2, dtype=torch.int32, device=x.device,
                                       requires_grad=False)
        return aten.index.Tensor(y, [iota, last]), stepped
    got, want = _check(fn, torch.randn(1, 64), torch.randn(1, 64, 2))
    assert all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want))


def test_aten_ops_on_numbers_are_constants_like_eager():
    def fn(a, b):
        return (aten.add(a, b), aten.sub(b, a), aten.mul(a, b), aten.div(a, b, rounding_mode=None),
                aten.div(a, b, rounding_mode="floor"), aten.add.default(a, b))
    for args in ((4, 3.3), (1024, 100)):
        got, want = _check(fn, *args)
        for g, w in zip(got, want):
            assert type(g) is type(w)
            assert (g.dtype == w.dtype and torch.equal(g, w)) if isinstance(w, torch.Tensor) else g == w
