"""Dropout in training: the forward and the backward use the same mask.

The capture layer writes F.dropout(training=True) as ``where(ge(rand(shape), p), x / (1-p), 0)``.
``core.rand`` is a random op: the partitioner never recomputes it, so the backward reads the
mask (or the random values) the forward drew."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.autograd import build_joint, partition
from kiln.ops import core

from autograd_helpers import trace_core


def _dropout_core(x, p):
    keep = core.ge(core.rand(tuple(x.shape), torch.float32, x.device), p)
    return core.where(keep, core.mul(x, 1.0 / (1.0 - p)), 0.0)


@pytest.mark.parametrize("strategy", ["min_cut", "save_all"])
def test_partitioner_saves_the_mask_and_never_recomputes_rand(strategy):
    x = torch.randn(8, 16, requires_grad=True)
    graph = trace_core(lambda x: core.tanh(_dropout_core(core.mul(x, 2.0), 0.3)), x)
    part = partition(build_joint(graph), strategy)
    assert any(n.target is core.rand for n in part.forward.calls)
    assert not any(n.target is core.rand for n in part.backward.calls)
    if strategy == "min_cut":  # the bool mask (1 byte / element) is the cheapest thing to save
        saved_dtypes = [n.meta["val"].dtype for n in part.saved]
        assert torch.bool in saved_dtypes and torch.float32 in saved_dtypes  # mask and tanh output


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_grad_uses_the_forward_mask(backend, p):
    def f(x, w):
        h = F.dropout(x * w, p, training=True)
        return (h * 3.0).sum(-1), h

    compiled = kiln.compile(f, backend=backend)
    x = (torch.rand(32, 64) + 0.5).requires_grad_()   # nonzero, so out != 0 recovers the mask
    w = (torch.rand(64) + 0.5).requires_grad_()
    with kiln.config.patch(strict=True):
        for _ in range(2):  # a second call draws a new mask
            s, h = compiled(x, w)
            mask = h != 0
            scale = 1.0 / (1.0 - p)
            torch.testing.assert_close(h, torch.where(mask, x * w * scale, 0.0).detach())
            gs, gh = torch.randn_like(s), torch.randn_like(h)
            gx, gw = torch.autograd.grad((s, h), (x, w), (gs, gh))
            g_h = gs[:, None] * 3.0 + gh
            want_gx = torch.where(mask, g_h * scale, 0.0) * w
            want_gw = (torch.where(mask, g_h * scale, 0.0) * x).sum(0)
            torch.testing.assert_close(gx, want_gx.detach())
            torch.testing.assert_close(gw, want_gw.detach(), rtol=1e-5, atol=1e-4)
            keep = mask.float().mean().item()
            assert abs(keep - (1 - p)) < 0.05
    first = mask
    s, h = compiled(x, w)
    assert not torch.equal(h != 0, first)


def test_dropout_module_train_eval():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4))
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(8, 16)
    with kiln.config.patch(strict=True):
        model.eval()
        torch.testing.assert_close(compiled(x), model(x))
        model.train()
        out = compiled(x)
        out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
