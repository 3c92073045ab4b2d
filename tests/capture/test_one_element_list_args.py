"""Convolution and pooling arguments given as a list of one (``Conv2d(stride=[1])``, peer
``test_convolution3``/``test_convolution5``): torch expands them to every spatial dim; capture
read them as one dim and failed ("tuple index out of range"), running the frame eagerly."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kiln


def test_one_element_lists_expand_to_every_spatial_dim():
    conv = torch.nn.Conv2d(5, 6, [3, 3], stride=[1], padding=[0], dilation=[1])
    x = torch.randn(2, 5, 16, 16)
    w = torch.randn(1, 1, 5, 5)
    y = torch.randn(2, 1, 16, 20)
    cases = [
        (conv, (x,)),
        (lambda y, w: F.conv2d(y, w, dilation=[y.size(0)], stride=[2], padding=[1]).sum(), (y, w)),
        (lambda y: F.max_pool2d(y, [3], stride=[2]), (y,)),
        (lambda y: F.avg_pool2d(y, [2], stride=[2], padding=[1]), (y,)),
    ]
    for fn, args in cases:
        kiln.reset()
        with torch.no_grad():
            got, want = kiln.compile(fn, fullgraph=True)(*args), fn(*args)
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-4)
        assert kiln.stats()["eager_runs"] == 0 and kiln.stats()["fallbacks"] == 0


def test_conv3d_compiles_with_its_gradients():
    """F.conv3d had no capture rule: a break wherever a gradient was needed (peer
    ``test_conv3d``, ``test_conv3d_channels_last``)."""
    for channels_last in (False, True):
        m = torch.nn.Sequential(torch.nn.Conv3d(3, 4, 3, stride=2, padding=1), torch.nn.ReLU())
        x = torch.randn(2, 3, 6, 7, 8)
        if channels_last:
            x = x.to(memory_format=torch.channels_last_3d)
        x.requires_grad_()
        kiln.reset()
        got = kiln.compile(m, fullgraph=True)(x)
        got.sum().backward()
        grads = [p.grad.clone() for p in m.parameters()] + [x.grad.clone()]
        m.zero_grad()
        x.grad = None
        want = m(x)
        want.sum().backward()
        assert got.stride() == want.stride() and torch.allclose(got, want, atol=1e-5)
        for g, w in zip(grads, [p.grad for p in m.parameters()] + [x.grad]):
            assert torch.allclose(g, w, atol=1e-4, rtol=1e-4)
        assert kiln.stats()["eager_runs"] == 0 and kiln.stats()["fallbacks"] == 0
