"""Creation entries: zeros/ones/full/empty (and *_like), arange, linspace, eye, new_* methods,
torch.tensor constants; rand/randn/randint are compared statistically."""
from __future__ import annotations

import torch

from .common import F32, OpEntry, rand


def x64(dtype, device):
    return [(rand((6, 4), dtype, device),)]


def C(name, fn, **kw):
    return OpEntry(name, fn, x64, F32, **kw)


def _stats(actual, expected):
    z, i, u = actual
    assert z.shape == expected[0].shape and z.dtype == expected[0].dtype
    assert abs(z.float().mean().item()) < 0.1 and abs(z.float().std().item() - 1) < 0.1
    assert i.dtype == torch.int64 and i.min().item() == 3 and i.max().item() == 8
    assert u.dtype == expected[2].dtype and 0 <= u.min().item() and u.max().item() < 1


ENTRIES = [
    C("zeros_ones_full", lambda x: torch.zeros(6, 4, device=x.device) + torch.ones(4, device=x.device) * 2
      + torch.full((6, 1), 0.5, device=x.device) + x),
    C("like", lambda x: torch.zeros_like(x) + torch.ones_like(x, dtype=torch.float64) + torch.full_like(x, 7)),
    # empty memory may hold NaN or inf: nan_to_num first, so that * 0 is 0 on both sides
    C("empty_then_fill", lambda x: torch.empty_like(x).nan_to_num().mul(0) + x
      + torch.empty(6, 4, device=x.device).nan_to_num().mul(0)),
    C("arange_int", lambda x: torch.arange(5, device=x.device) * 3 + torch.arange(2, 12, 2, device=x.device)),
    C("arange_float", lambda x: torch.arange(0, 1, 0.125, device=x.device)
      + torch.arange(-1.5, 1.5, 0.5, dtype=torch.float64, device=x.device).sum()),
    C("linspace", lambda x: torch.linspace(-3, 7, 11, device=x.device) + torch.linspace(0, 1, 5, device=x.device).sum()),
    C("eye", lambda x: torch.eye(4, device=x.device) @ torch.eye(4, 3, device=x.device) + x[:4, :3]),
    C("new_methods", lambda x: x.new_zeros(2, 4) + x.new_ones((2, 4)) + x.new_full((2, 4), 3.0)),
    C("tensor_constant", lambda x: x * torch.tensor([1.0, -2.0, 3.0, 0.5], device=x.device)),
    C("bool_full", lambda x: torch.full((4,), True, device=x.device) & (x[0] > 0)),
    OpEntry("random", lambda x: (torch.randn_like(x), torch.randint(3, 9, (4000,), device=x.device),
                                 torch.rand(4000, device=x.device)),
            lambda dt, dev: [(torch.zeros(4000, device=dev),)], F32, compare=_stats),
]
