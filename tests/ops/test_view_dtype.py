"""Tensor.view(dtype): a bitcast view. Shapes and strides follow eager's rules for equal, smaller
and larger element sizes; writes through the view reach its base (and the caller's input)."""
import pytest
import torch

import kiln
from testing import assert_close


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.float64, torch.bfloat16])
def test_view_dtype_matches_eager(dtype):
    def fn(x):
        return (x * 2).view(dtype), x.view(dtype)
    x = torch.randn(4, 8)
    e = kiln.explain(fn)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    for got, want in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        _same(got, want)


def test_view_dtype_of_a_strided_input_scales_the_other_strides():
    def fn(x):
        return x[:, 1:3].view(torch.int8), x.t().contiguous().view(torch.int16)
    x = torch.randn(5, 4)
    for got, want in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        _same(got, want)


def test_bit_tricks_through_view_dtype():
    def fn(x):
        bits = x.view(torch.int32)
        return ((bits & 0x7FFFFFFF).view(torch.float32), bits & 0x7F800000)
    x = torch.randn(6, 7)
    for got, want in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        _same(got, want)


def test_writes_through_a_dtype_view_reach_the_base_and_the_input():
    def fn(x):
        v = x.view(torch.int32)
        v.add_(1)             # the next float up, through the view
        return x * 1, v + 0
    x = torch.randn(3, 4)
    x_ref = x.clone()
    got = kiln.compile(fn, fullgraph=True)(x)
    want = fn(x_ref)
    for g, w in zip(got, want):
        _same(g, w)
    assert torch.equal(x, x_ref)


def test_a_larger_element_needs_a_divisible_last_dim():
    x = torch.zeros(4, 3, dtype=torch.int8)
    with pytest.raises(Exception):
        x.view(torch.int32)  # eager refuses
    with pytest.raises(RuntimeError, match="divisible"):  # kiln raises eager's own error
        kiln.compile(lambda x: x.view(torch.int32))(x)


def test_gradient_through_the_float_path_next_to_a_dtype_view():
    def fn(x):
        return ((x.view(torch.int32) & 0xFF).float() * x).sum()
    x = torch.randn(4, 6, requires_grad=True)
    kiln.compile(fn, fullgraph=True)(x).backward()
    g = x.grad
    x2 = x.detach().clone().requires_grad_()
    fn(x2).backward()
    assert_close(g, x2.grad)


def test_view_by_keyword_dtype_or_size():
    # x.view(dtype=...) and x.view(size=...): eager's overloads by keyword (before, a fallback
    # to eager: "view() got an unexpected keyword argument 'dtype'"; peer test_float32_to_int32)
    def fn(a, b):
        x = a + b
        bits = x.view(dtype=torch.int32)
        return bits.mul(2) + bits.bitwise_and(2), x.view(size=(2, 2))
    a = 0.5 * torch.ones(4)
    for got, want in zip(kiln.compile(fn, fullgraph=True)(a, a), fn(a, a)):
        _same(got, want)
