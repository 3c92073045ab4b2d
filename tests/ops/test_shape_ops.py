"""Shape ops (kiln/ops/core_shape.py and the view entries of the capture table) against eager,
generated from one table of op x dtypes: through decomposition (backend aot_eager) and through
the whole compiler on each code-generation target.

The input is a non-contiguous (4, 6, 5) view; most entries multiply their result by 2 so a
kernel reads the view through the op's index transform.
"""
import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import TARGETS, assert_close, on_target, randn

F32 = (torch.float32,)
MIXED = (torch.float32, torch.bfloat16, torch.int64)

STEP = (slice(1, 3), slice(None, None, 2), slice(1, None))
STEP2 = (slice(None), slice(None, None, 2), slice(1, None))
NEGATIVE = (slice(-2, None), slice(None, -1), slice(-3, -1))
LAST_ZERO = (Ellipsis, 0)
MIXED_KEY = (slice(None), 2, slice(-1, None))
NONE_ELLIPSIS = (None, Ellipsis, None)
FIRST_ROWS = (0, slice(1, None))


def _each(parts):
    out = []
    for p in parts:
        out.append(p * 2)
    return tuple(out)


# name -> (fn(x, y), dtypes, selects by position: ir.IndexValue in codegen)
OPS = {
    "view_reshape": (lambda x, y: x.reshape(4, 30).view(2, 2, -1) * 2, MIXED, False),
    "flatten": (lambda x, y: torch.flatten(x, 1) * 2 + x.flatten().sum(), F32, False),
    "unflatten": (lambda x, y: x.unflatten(1, (2, 3)) * 2, F32, False),
    "t_transpose_permute": (lambda x, y: x.select(0, 0).t() * 2 + x.permute(2, 0, 1).transpose(0, 2).select(1, 0).t(), F32, False),
    "expand_as": (lambda x, y: y.expand_as(x) + x, F32, False),
    # x.__getitem__(KEY) is the adapter that x[KEY] reaches; test_subscript_syntax uses the operator
    "slice_step": (lambda x, y: x.__getitem__(STEP) * 2, MIXED, False),
    "slice_negative": (lambda x, y: x.__getitem__(NEGATIVE) * 2, F32, False),
    "select_int": (lambda x, y: x.__getitem__(1) * 2 + x.__getitem__(LAST_ZERO).sum() + x.__getitem__(MIXED_KEY).sum(), MIXED, False),
    "none_ellipsis": (lambda x, y: x.__getitem__(NONE_ELLIPSIS).__getitem__(FIRST_ROWS) * 2, F32, False),
    "narrow_select": (lambda x, y: x.narrow(1, 2, 3) * 2 + torch.select(x, 1, 0).unsqueeze(1), F32, False),
    "split": (lambda x, y: _each(torch.split(x, 2, 1)), MIXED, False),
    "split_sections": (lambda x, y: _each(x.split([1, 3, 2], dim=1)), F32, False),
    "chunk": (lambda x, y: _each(x.chunk(3, dim=2)), F32, False),
    "unbind": (lambda x, y: _each(x.unbind(0)), F32, False),
    "flip": (lambda x, y: torch.flip(x, (0, 2)) * 2, MIXED, False),
    "roll": (lambda x, y: torch.roll(x, 2, 1) * 2 + x.roll((1, -2), (0, 2)) + torch.roll(x, 7), MIXED, False),
    "repeat": (lambda x, y: y.repeat(2, 3) * 2 + x.narrow(1, 0, 1).repeat(1, 1, 1).sum(), MIXED, False),
    "slice_into_mm": (lambda x, y: x.select(0, 1).narrow(1, 1, 4) @ x.select(0, 2).narrow(1, 0, 4).t(), F32, False),
    "cat": (lambda x, y: torch.cat([x, x.narrow(1, 0, 2) * 3, x.narrow(1, 5, 1)], dim=1) * 2, MIXED, True),
    "cat_promotes": (lambda x, y: torch.cat((x.select(0, 0), y.to(torch.int32)), 0), F32, True),
    "stack": (lambda x, y: torch.stack([x.select(0, 0), y, x.select(0, 1) * 2], dim=1), MIXED, True),
    "tril_triu": (lambda x, y: torch.tril(x) + torch.triu(x, 1) * 2 + x.tril(-1), MIXED, True),
    "pad": (lambda x, y: F.pad(x, (1, 2, 0, 1), value=0.5 if x.is_floating_point() else 3), MIXED, True),
    "pad_negative": (lambda x, y: F.pad(x, (-1, 2)) * 2, F32, True),
}


def make_inputs(dtype, device):
    x = randn((5, 6, 4), dtype, device).permute(2, 1, 0)  # (4, 6, 5), non-contiguous
    y = randn((6, 5), dtype, device)
    return x, y


def _check(actual, expected):
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _check(a, e)
        return
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert_close(actual, expected)


CASES = [(n, d) for n, (_, dtypes, _) in OPS.items() for d in dtypes]
IDS = [f"{n}-{str(d).split('.')[-1]}" for n, d in CASES]


@pytest.mark.parametrize("name,dtype", CASES, ids=IDS)
def test_decomposition_matches_eager(name, dtype):
    fn = OPS[name][0]
    args = make_inputs(dtype, torch.device("cpu"))
    _check(kiln.compile(fn, backend="aot_eager", fullgraph=True)(*args), fn(*args))


def _kiln_cases():
    out = []
    for target in TARGETS:
        for name, dtype in CASES:
            if target.id == "cpp" and dtype != torch.float32:
                continue  # one gcc build per entry: other dtypes run on the Triton interpreter
            out.append(pytest.param(name, dtype, target.values[0],
                                    id=f"{name}-{str(dtype).split('.')[-1]}-{target.id}"))
    return out


@pytest.mark.parametrize("name,dtype,target", _kiln_cases())
def test_compiled_matches_eager(name, dtype, target):
    fn = OPS[name][0]
    with on_target(target) as device:
        args = make_inputs(dtype, device)
        _check(kiln.compile(fn, fullgraph=True)(*args), fn(*args))


@pytest.mark.parametrize("target", TARGETS)
def test_views_fuse_into_one_kernel(target):
    def f(x):
        a = x.__getitem__(STEP).flip(0) * 2
        b = torch.roll(x.narrow(0, 1, 2), 1, 1).__getitem__(STEP2)
        return torch.sigmoid(a + b).repeat(1, 1, 1)
    with on_target(target) as device:
        x = make_inputs(torch.float32, device)[0]
        assert kiln.explain(f)(x).kernel_count == 1
        assert_close(kiln.compile(f, fullgraph=True)(x), f(x))


def test_slice_of_input_feeds_mm_without_a_copy():
    def f(x, w):
        return x.narrow(1, 1, 8) @ w.t().narrow(0, 1, 8)
    x, w = torch.randn(8, 9), torch.randn(7, 9)
    explain = kiln.explain(f)(x, w)
    assert explain.kernel_count == 0
    assert_close(kiln.compile(f, fullgraph=True)(x, w), f(x, w))


@pytest.mark.parametrize("fn,exc", [
    (lambda x: x.__getitem__(7), IndexError),
    (lambda x: torch.cat([x, x[:, :, :2].sum(-1)], 0), RuntimeError),
])
def test_bad_input_raises_like_eager(fn, exc):
    x = torch.randn(4, 6, 5)
    with pytest.raises(exc):
        fn(x)
    with pytest.raises(Exception):
        kiln.compile(fn, fullgraph=True)(x)


def test_subscript_syntax():
    fn = lambda x: x[1:3, ::2, None, 0] * 2 + x[-1, ::2, None, 0]  # noqa: E731
    x = make_inputs(torch.float32, torch.device("cpu"))[0]
    assert_close(kiln.compile(fn, fullgraph=True)(x), fn(x))
