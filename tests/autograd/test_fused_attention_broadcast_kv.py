"""Fused attention in training over broadcast keys and values computed in the graph: multi-query
attention (Falcon, GPT-BigCode) rotates one key head and expands it to every query head.

The fused kernels' results were given the layout of their operands, read off strides; an
expanded operand's stride 0 sorted its head dim innermost, so the backward's k and v were
written in a [B, T, D, H]-like layout, head dim not contiguous, which torch's CPU flash
kernel reads as if it were: garbage gradients (up to 10^4 here; 0.5% to 100% of the size of
Falcon's and GPT-BigCode's attention gradients). The layout now always keeps the head dim
innermost, and a broadcast operand's is row-major."""
import pytest
import torch
import torch.nn.functional as F

import kiln


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


@pytest.mark.parametrize("gqa", [False, True], ids=["expand", "enable_gqa"])
def test_mqa_with_rotated_key_gradients_match_eager(gqa):
    torch.manual_seed(0)
    heads, dim, seq = 4, 8, 12
    cos, sin = torch.randn(seq, dim), torch.randn(seq, dim)

    def loss(x, w):
        q, k, v = (x @ w).view(2, seq, -1, dim).split([heads, 1, 1], dim=-2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if gqa:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(q, k.expand(-1, heads, -1, -1),
                                               v.expand(-1, heads, -1, -1), is_causal=True)
        o = o.transpose(1, 2).reshape(2, seq, -1)
        return (o * torch.linspace(0.5, 1.5, o.numel()).view(o.shape)).sum()
    x, w = torch.randn(2, seq, 32), torch.randn(32, (heads + 2) * dim, requires_grad=True)
    want = torch.autograd.grad(loss(x, w), w)[0]
    kiln.reset()
    got = torch.autograd.grad(kiln.compile(loss)(x, w), w)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())


def test_expanded_key_computed_in_graph():
    torch.manual_seed(0)

    def loss(q, k, v):
        o = F.scaled_dot_product_attention(q, (k * 2).expand(-1, 4, -1, -1), v.expand(-1, 4, -1, -1),
                                           is_causal=True)
        return (o * torch.linspace(0.5, 1.5, o.numel()).view(o.shape)).sum()
    q = torch.randn(2, 4, 12, 8, requires_grad=True)
    k, v = (torch.randn(2, 1, 12, 8, requires_grad=True) for _ in range(2))
    want = torch.autograd.grad(loss(q, k, v), (q, k, v))
    kiln.reset()
    got = torch.autograd.grad(kiln.compile(loss)(q, k, v), (q, k, v))
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5 * e.abs().max().item())
