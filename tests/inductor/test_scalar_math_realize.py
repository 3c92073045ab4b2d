"""A multi-use value holding a scalar libm call (sin, cos, pow ...) is stored once by C++
kernels instead of being recomputed by each consumer (``lower._recompute_is_costly``,
``cpp.scalar_math_call``). A Llama's rotary embedding computes cos and sin over
[seq, head_dim]; the q and k rotations of every layer read them broadcast over batch and heads,
and recomputed each element with glibc's scalar calls (two rotations at [2, 4, 64, 32]: 0.5 ms,
the model's largest kernels)."""
import re

import pytest
import torch

import kiln
from testing import TARGETS, assert_close, on_target


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary(q, k, inv_freq):
    pos = torch.arange(q.shape[2], dtype=torch.float32, device=q.device)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _inputs():
    return (torch.randn(2, 4, 64, 32), torch.randn(2, 4, 64, 32),
            1.0 / (10000 ** (torch.arange(0, 32, 2, dtype=torch.float32) / 32)))


def test_rotary_cos_and_sin_are_computed_once():
    with on_target(("cpu", "cpp")), kiln.config.patch(strict=True):
        out = kiln.explain(rotary)(*_inputs())
    calls = [(k.numel, len(re.findall(r"std::(?:cos|sin)\(", k.source))) for k in out.kernels]
    with_trig = [(n, c) for n, c in calls if c]
    # each of cos and sin once per element of [64, 32], in one kernel or two
    assert with_trig and all(n == 64 * 32 for n, _ in with_trig), calls
    assert sum(c for _, c in with_trig) == 2, calls


@pytest.mark.parametrize("target", TARGETS)
def test_rotary_matches_eager(target):
    with on_target(target) as device, kiln.config.patch(strict=True):
        q, k, f = (t.to(device) for t in _inputs())
        got = kiln.compile(rotary)(q, k, f)
        q, k, f = (t.to(device) for t in _inputs())
        for g, w in zip(kiln.compile(rotary)(q, k, f), rotary(q, k, f)):
            assert_close(g, w)
        assert len(got) == 2


def test_costly_broadcast_value_without_libm_calls_stays_inlined():
    """Only a scalar libm call makes a value read through a broadcast worth storing: a chain of
    cheap vectorized ops is recomputed in its consumer's kernel, as before (storing those split
    off GPT-2's position-embedding gather into a kernel of its own)."""
    def fn(x, b):
        v = ((b * 2 + 1).abs() - 3).clamp(min=0) * b + 0.5  # > INLINE_OPS_LIMIT ops, no libm call
        return x * v[None, :]
    x, b = torch.randn(64, 128), torch.randn(128)
    with on_target(("cpu", "cpp")), kiln.config.patch(strict=True):
        out = kiln.explain(fn)(x, b)
        assert out.kernel_count == 1, [k.numel for k in out.kernels]
        x, b = torch.randn(64, 128), torch.randn(128)
        assert_close(kiln.compile(fn)(x, b), fn(x, b))
