"""Results keep eager's strides where eager's come from another tensor's layout (peer
test_torchinductor ``test_like_channels_last``, ``test_exact_stride``):

- a ``*_like`` factory follows its input (``torch.preserve_format``, the default): before,
  ``zeros_like`` of a channels-last tensor came out contiguous;
- a tensor written in place keeps its own strides: ``t = torch.empty_strided(...); t[:] = v``
  returned ``v``'s contiguous layout.

Compared with eager: dtype, strides and values (the random ones by their shape and range)."""
from __future__ import annotations

import pytest
import torch

import kiln

CL = torch.channels_last


def _inputs():
    x = torch.randn(2, 3, 4, 5)
    return [x, x.to(memory_format=CL), x.permute(0, 1, 3, 2), x[:, :, ::2]]


LIKE = {
    "zeros_like": lambda x: torch.zeros_like(x) + 0 * x,
    "ones_like": lambda x: torch.ones_like(x),
    "empty_like": lambda x: torch.empty_like(x).zero_(),
    "full_like": lambda x: torch.full_like(x, 3.0),
    "full_like_dtype": lambda x: torch.full_like(x, 3, dtype=torch.int32),
    "zeros_like_cl": lambda x: torch.zeros_like(x, memory_format=CL),
    "ones_like_contiguous": lambda x: torch.ones_like(x, memory_format=torch.contiguous_format),
}


def _same(got, expected):
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.stride() == expected.stride(), (got.stride(), expected.stride())
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(LIKE))
@pytest.mark.parametrize("which", range(4), ids=["contiguous", "channels_last", "permuted",
                                                 "sliced"])
def test_like_factories_follow_their_input_layout(name, which):
    fn = LIKE[name]
    x = _inputs()[which]
    _same(kiln.compile(fn, fullgraph=True)(x), fn(x))


@pytest.mark.parametrize("op", ["rand_like", "randn_like"])
def test_random_like_factories_follow_their_input_layout(op):
    fn = getattr(torch, op)
    x = _inputs()[1]
    got, expected = kiln.compile(fn, fullgraph=True)(x), fn(x)
    assert (got.dtype, got.shape, got.stride()) == (expected.dtype, expected.shape, expected.stride())


def test_whole_write_into_empty_strided_keeps_its_strides():
    def fn(x):
        out = torch.empty_strided(x.size(), x.stride())
        out[:] = x + x
        return out

    full = torch.randn(16, 16)
    view = torch.as_strided(full, (16, 8), full.stride())
    _same(kiln.compile(fn, fullgraph=True)(view), fn(view))


def test_copy_into_empty_like_of_a_transpose_keeps_its_strides():
    def fn(x):
        out = torch.empty_like(x.t())
        out.copy_(x.t() * 2)
        return out

    x = torch.randn(3, 5)
    _same(kiln.compile(fn, fullgraph=True)(x), fn(x))
