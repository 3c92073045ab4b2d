"""``to``/``contiguous``/``clone(memory_format=...)`` and ``is_contiguous(memory_format=...)``
(issue 24 memory format, peer ``test_to_memory_format``): before, a break for every memory
format but contiguous, and ``is_contiguous`` ignored the format it was asked about (False for
a channels-last tensor asked about channels_last: a wrong branch)."""
from __future__ import annotations

import pytest
import torch

import kiln

CL, CL3, CF = torch.channels_last, torch.channels_last_3d, torch.contiguous_format


def _inputs():
    x = torch.randn(2, 3, 4, 5)
    return [x, x.to(memory_format=CL), x.permute(0, 1, 3, 2), torch.randn(2, 1, 4, 5)]


CASES = {
    "to_cl": lambda x: (x.to(memory_format=CL) * 2, x.to(memory_format=CL)),
    "to_cf": lambda x: x.to(memory_format=CF) + 1,
    "to_dtype_cl": lambda x: x.to(torch.float64, memory_format=CL),
    "contiguous_cl": lambda x: x.contiguous(memory_format=CL),
    "clone_cl": lambda x: (x.clone(memory_format=CL), torch.clone(x, memory_format=CF)),
    "to_copy": lambda x: x.to(copy=True),
    "is_contiguous": lambda x: x * 2 if x.is_contiguous(memory_format=CL) else x - 1,
    "is_contiguous_both": lambda x: (x.is_contiguous(), x.is_contiguous(memory_format=CL),
                                     (x + 1).is_contiguous(memory_format=CL)),
    "cl_3d": lambda x: x.unsqueeze(2).to(memory_format=CL3).sum(2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_memory_formats_match_eager(case):
    fn = CASES[case]
    for x in _inputs():
        kiln.reset()
        got, want = kiln.compile(fn, fullgraph=True)(x), fn(x)
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                significant = [d for d in range(w.dim()) if w.size(d) > 1]
                assert [g.stride(d) for d in significant] == [w.stride(d) for d in significant], (g.stride(), w.stride())
                assert g.dtype == w.dtype and torch.equal(g, w)
            else:
                assert g == w
        assert kiln.stats()["eager_runs"] == 0


def test_to_a_copy_does_not_alias_and_a_same_format_to_is_the_tensor():
    def fn(x):
        y = x.to(memory_format=CL)
        z = x.clone(memory_format=CL)
        z.add_(1)
        return y is x, z
    x = torch.randn(2, 3, 4, 5).to(memory_format=CL)
    got, want = kiln.compile(fn)(x), fn(x)
    assert got[0] is want[0] is True and torch.equal(got[1], want[1])
    assert torch.equal(x, x.clone())  # not written through z


def test_channels_last_of_a_3d_tensor_raises_as_eager():
    with pytest.raises(RuntimeError, match="rank 4"):
        kiln.compile(lambda x: x.to(memory_format=CL))(torch.randn(2, 3, 4))
