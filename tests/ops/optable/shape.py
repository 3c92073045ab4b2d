"""View and shape entries: view/reshape/flatten/unflatten/permute/transpose/t/expand/squeeze/
unsqueeze/contiguous, slicing and select, split/chunk/unbind, cat/stack, narrow, indexing with
tensors (gather, index_select, scatter/scatter_add, index_put), repeat, roll, tril/triu, flip,
pad. The input is a non-contiguous (4, 6, 5) view; most results are scaled so a kernel reads the
view through the op's index transform."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import ALL, F32, BadInput, OpEntry, rand

MIXED = (torch.float32, torch.bfloat16, torch.int64)
STEP = (slice(1, 3), slice(None, None, 2), slice(1, None))
NEGATIVE = (slice(-2, None), slice(None, -1), slice(-3, -1))
LAST_ZERO = (Ellipsis, 0)
MIXED_KEY = (slice(None), 2, slice(-1, None))
NONE_ELLIPSIS = (None, Ellipsis, None)


def xy(dtype, device):
    x = rand((5, 6, 4), dtype, device).permute(2, 1, 0)  # (4, 6, 5), non-contiguous
    return [(x, rand((6, 5), dtype, device)), (rand((4, 6, 5), dtype, device), rand((1, 5), dtype, device))]


def idx(dtype, device):
    x = rand((4, 6), dtype, device)
    return [(x, torch.randint(0, 6, (4, 3), device=device), rand((4, 3), dtype, device)),
            (x.t(), torch.randint(0, 4, (6, 2), device=device), rand((6, 2), dtype, device))]


def unique_idx(dtype, device):
    """Distinct indices (some negative) along dim 0 of a (4, 6) and a transposed (6, 4) tensor:
    with accumulate=False, eager leaves the value of a repeated index unspecified."""
    x = rand((4, 6), dtype, device)
    return [(x, torch.randperm(4, device=device)[:3] - 1, rand((3, 6), dtype, device)),
            (x.t(), torch.randperm(6, device=device)[:4] - 2, rand((1,), dtype, device)),
            (x, torch.randperm(4, device=device)[:2], rand((6,), dtype, device))]


def unique_rows(dtype, device):
    """scatter along dim 1 with distinct indices in each row (a permutation's first columns)."""
    x = rand((4, 6), dtype, device)
    i = torch.argsort(torch.rand(4, 6, device=device), dim=1)
    j = torch.argsort(torch.rand(6, 4, device=device), dim=1)
    return [(x, i[:, :3], rand((4, 3), dtype, device)), (x.t(), j[:5, :2], rand((5, 3), dtype, device))]


def _each(parts):
    return tuple(p * 2 for p in parts)


def S(name, fn, dtypes=F32, samples=xy, **kw):
    return OpEntry(name, fn, samples, dtypes, **kw)


ENTRIES = [
    S("view_reshape", lambda x, y: x.reshape(4, 30).view(2, 2, -1) * 2, MIXED, differentiable=True),
    S("flatten", lambda x, y: torch.flatten(x, 1) * 2 + x.flatten().sum(), differentiable=True),
    S("unflatten", lambda x, y: x.unflatten(1, (2, 3)) * 2, differentiable=True),
    S("permute_transpose_t", lambda x, y: x.select(0, 0).t() * 2 + x.permute(2, 0, 1).transpose(0, 2).select(1, 0).t(),
      differentiable=True),
    S("expand", lambda x, y: y.expand_as(x) + x + y.expand(2, 4, 6, 5).sum(0), differentiable=True),
    S("squeeze_unsqueeze", lambda x, y: x.unsqueeze(1).squeeze(1) * 2 + x[:, :1].squeeze().sum() + torch.squeeze(x.unsqueeze(-1), -1),
      differentiable=True),
    S("contiguous", lambda x, y: x.contiguous() * 2 + x.select(0, 0).t().contiguous().sum(), MIXED),
    S("slice_step", lambda x, y: x.__getitem__(STEP) * 2, MIXED, differentiable=True),
    S("slice_negative", lambda x, y: x.__getitem__(NEGATIVE) * 2, differentiable=True),
    S("select_int", lambda x, y: x.__getitem__(1) * 2 + x.__getitem__(LAST_ZERO).sum() + x.__getitem__(MIXED_KEY).sum(),
      MIXED, differentiable=True),
    S("none_ellipsis", lambda x, y: x.__getitem__(NONE_ELLIPSIS) * 2),
    S("narrow_select", lambda x, y: x.narrow(1, 2, 3) * 2 + torch.select(x, 1, 0).unsqueeze(1), differentiable=True),
    S("split", lambda x, y: _each(torch.split(x, 2, 1)), MIXED, differentiable=True),
    S("split_sections", lambda x, y: _each(x.split([1, 3, 2], dim=1))),
    S("chunk", lambda x, y: _each(x.chunk(3, dim=2)), differentiable=True),
    S("unbind", lambda x, y: _each(x.unbind(0)), differentiable=True),
    S("flip", lambda x, y: torch.flip(x, (0, 2)) * 2, MIXED, differentiable=True),
    S("roll", lambda x, y: torch.roll(x, 2, 1) * 2 + x.roll((1, -2), (0, 2)) + torch.roll(x, 7), MIXED,
      differentiable=True),
    S("repeat", lambda x, y: y.repeat(2, 3) * 2 + x.narrow(1, 0, 1).repeat(1, 1, 1).sum(), MIXED, differentiable=True),
    S("cat", lambda x, y: torch.cat([x, x.narrow(1, 0, 2) * 3, x.narrow(1, 5, 1)], dim=1) * 2, MIXED,
      differentiable=True),
    S("cat_promotes", lambda x, y: torch.cat((x.select(0, 0), y.to(torch.int32)), 0)),
    S("stack", lambda x, y: torch.stack([x.select(0, 0), y.expand(6, 5), x.select(0, 1) * 2], dim=1), MIXED,
      differentiable=True),
    S("tril_triu", lambda x, y: torch.tril(x) + torch.triu(x, 1) * 2 + x.tril(-1), MIXED, differentiable=True),
    S("pad", lambda x, y: F.pad(x, (1, 2, 0, 1), value=0.5 if x.is_floating_point() else 3), MIXED,
      differentiable=True),
    S("pad_negative", lambda x, y: F.pad(x, (-1, 2)) * 2, differentiable=True),
    S("slice_into_mm", lambda x, y: x.select(0, 1).narrow(1, 1, 4) @ x.select(0, 2).narrow(1, 0, 4).t()),
    # indexing with tensors
    S("gather", lambda x, i, s: torch.gather(x, 1, i % x.shape[1]) + 1, ALL, idx, differentiable=True),
    S("index_select", lambda x, i, s: x.index_select(0, i[0] % x.shape[0]) * 2, ALL, idx, differentiable=True),
    S("tensor_index", lambda x, i, s: x[i[:, 0] % x.shape[0]] + x[:, i[0] % x.shape[1]].sum(), ALL, idx),
    OpEntry("scatter_add", lambda x, i, s: torch.scatter_add(x, 1, i % x.shape[1], s), idx,
            (torch.float32, torch.int64), differentiable=True),
    OpEntry("scatter", lambda x, i, s: torch.scatter(x, 1, i, s) * 2 + x.scatter(1, i, 0.5), unique_rows,
            ALL, differentiable=True),
    OpEntry("index_put", lambda x, i, s: torch.index_put(x, (i,), s) * 2 + x.index_put([i], s, accumulate=True),
            unique_idx, ALL, differentiable=True),
]

BAD = [
    BadInput("reshape_wrong_numel", lambda x: x.reshape(7, 3), lambda: (torch.randn(4, 5),)),
    BadInput("cat_rank_mismatch", lambda x: torch.cat([x, x.sum(-1)], 0), lambda: (torch.randn(4, 5),)),
    BadInput("index_out_of_range", lambda x: x[7], lambda: (torch.randn(4, 5),)),
    BadInput("transpose_bad_dim", lambda x: x.transpose(0, 3), lambda: (torch.randn(4, 5),)),
    BadInput("gather_float_index", lambda x, i: torch.gather(x, 1, i), lambda: (torch.randn(3, 4), torch.randn(3, 4))),
]
