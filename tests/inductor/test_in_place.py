"""A pointwise Triton kernel writes its result over a buffer it reads for the last time
(codegen/wrapper.py ``_in_place_source``): same dtype and element count, both dense, read only
at the element stored. ResNet's downsampling block (bn + bn + add + ReLU over two convolution
outputs) otherwise allocated a third activation beside the two it reads. The values must be
eager's; a kernel that reads other elements of the buffer (a transpose, a window), a buffer
read again later, an input and an output are never written over; C++ kernels (whose pointers
are ``__restrict__``) never write in place."""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from testing import TARGETS, on_target

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


class Downsample(nn.Module):  # ResNet's first bottleneck of a stage, its last ops
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.down = nn.Conv2d(8, 16, 1, stride=1, bias=False)
        self.bn_down = nn.BatchNorm2d(16)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)) + self.bn_down(self.down(x)))


def _wrapper(fn, *args):
    kiln.reset()
    out = kiln.explain(fn)(*args)
    return "\n".join(str(w) for w in out.wrappers)


def _in_place(src):
    return re.findall(r"# (\w+) is written in place over (\w+)", src)


def _randomized(model, device, dtype):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):  # eval statistics that are not the identity
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval().to(device, dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_a_downsampling_blocks_sum_is_written_over_a_convolution_output(target, dtype, layout):
    torch.manual_seed(0)
    device = target[0]
    model = _randomized(Downsample(), device, dtype)
    x = torch.randn(2, 8, 6, 6, device=device, dtype=dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    with torch.no_grad(), on_target(target):
        expected = model(x)
        src = _wrapper(model, x)
        actual = kiln.compile(model)(x)
    if device == "cuda" and dtype == torch.float32:  # TF32 convolutions, in eager and kiln alike
        tol = dict(rtol=1e-2, atol=1e-2)
    else:
        tol = TOL[dtype]
    torch.testing.assert_close(actual, expected, **tol)
    assert actual.dtype == expected.dtype and actual.stride() == expected.stride()
    pairs = _in_place(src)
    if target[1] == "cpp":
        assert not pairs, src
    else:  # the block's one kernel writes its result over a convolution's output
        assert len(pairs) == 1, src
        _check_written_over_after_its_last_read(src, pairs)
    assert kiln.stats()["fallbacks"] == 0


def _mm_then(fn):
    def f(a, b, c):
        return fn(a @ b, c)
    return f


CASES = {
    # reads the product at other elements than it stores: never in place
    "transpose": (_mm_then(lambda m, c: m + m.t() * c), (16, 16), False),
    "flip": (_mm_then(lambda m, c: torch.flip(m, (1,)) + c), (16, 16), False),
    # the product is read again by a later kernel (the sum): the first kernel may not take it
    "read_later": (_mm_then(lambda m, c: (torch.relu(m + c), (m * c).sum(0))), (16, 16), None),
    # same element, same shape: in place, also when broadcasting the other operand
    "pointwise": (_mm_then(lambda m, c: torch.sigmoid(m) * c), (16, 16), True),
    "broadcast": (_mm_then(lambda m, c: m * c[:1] + 1), (16, 16), True),
    # the product is also returned: the kernel must not overwrite it
    "returned": (_mm_then(lambda m, c: (m, torch.relu(m) + c)), (16, 16), False),
    # a dtype change: a bf16 result cannot be written over the fp32 product
    "cast": (_mm_then(lambda m, c: (m + c).to(torch.bfloat16)), (16, 16), False),
}


@pytest.mark.parametrize("target", [t for t in TARGETS if t.values[0][1] == "triton"] or
                         [pytest.param(None, marks=pytest.mark.skip(reason="no Triton target here"))])
@pytest.mark.parametrize("case", sorted(CASES))
def test_in_place_only_where_each_element_is_read_where_it_is_written(target, case):
    fn, shape, want = CASES[case]
    torch.manual_seed(0)
    device = target[0]
    a = torch.randn(shape, device=device)
    b = torch.randn(shape[1], shape[0], device=device).t()  # non-contiguous
    c = torch.randn(shape, device=device)
    a0, b0, c0 = a.clone(), b.clone(), c.clone()
    with on_target(target):
        src = _wrapper(fn, a, b, c)
        actual = kiln.compile(fn)(a, b, c)
    expected = fn(a0, b0, c0)
    torch.testing.assert_close(actual, expected, rtol=1e-2 if device == "cuda" else 1e-5, atol=1e-2 if device == "cuda" else 1e-5)
    for got, want_ in zip(*(o if isinstance(o, tuple) else (o,) for o in (actual, expected))):
        assert got.stride() == want_.stride()
    # the inputs are never written over
    assert torch.equal(a, a0) and torch.equal(b, b0) and torch.equal(c, c0)
    pairs = _in_place(src)
    _check_written_over_after_its_last_read(src, pairs)
    if want is True:
        assert pairs, src
    elif want is False:
        assert not pairs, src


def _check_written_over_after_its_last_read(src, pairs):
    """Each buffer written over is no input or output, and after the line that renames it only
    the launch of the kernel writing over it and its ``del`` name it."""
    lines = [ln.strip() for ln in src.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    inputs = re.search(r"def call\(([^)]*)\)", src).group(1).replace(" ", "").split(",")
    returned = next(ln for ln in lines if ln.startswith("return"))
    for new, old in pairs:
        assert old not in inputs and not re.search(rf"\b{old}\b", returned), src
        at = next(i for i, ln in enumerate(lines) if ln.startswith(f"{new} = ") and re.search(rf"\b{old}\b", ln))
        later = [ln for ln in lines[at + 1:] if re.search(rf"\b{old}\b", ln)]
        assert later and re.search(rf"\b{new}\b", later[0]) and not later[0].startswith("del"), src
        assert all(ln.startswith("del") for ln in later[1:]) and later[1:], src


@pytest.mark.parametrize("target", [t for t in TARGETS if t.values[0][1] == "triton"] or
                         [pytest.param(None, marks=pytest.mark.skip(reason="no Triton target here"))])
def test_a_tuned_kernel_writing_in_place_is_searched_on_a_copy(target, tmp_path):
    """The autotuner launches a large pointwise kernel once per config on the call's arguments
    (runtime/autotune.py): over a buffer it writes in place, each launch would apply the
    kernel again. The search runs on a copy; the real launch runs once."""
    torch.manual_seed(0)
    device = target[0]
    a, b = torch.randn(256, 64, device=device), torch.randn(64, 256, device=device)

    def f(a, b):
        return torch.relu(a @ b) * 2 + 1
    # a fresh cache: a choice on disk from an earlier run would skip the search
    with on_target(target), kiln.config.patch(triton_autotune="interpret" if device == "cpu" else True,
                                              cache_dir=str(tmp_path)):
        kiln.reset()
        out = kiln.explain(f)(a, b)  # the first call searches
        src = "\n".join(str(w) for w in out.wrappers)
        assert _in_place(src) and ".run(" in src, src  # in place, and tuned (256 x 256 elements)
        actual = out.result
        kiln.reset()
        again = kiln.compile(f)(a, b)  # the choice read back from the cache, launched once
    expected = f(a, b)
    tol = dict(rtol=1e-2, atol=1e-2) if device == "cuda" else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(actual, expected, **tol)
    torch.testing.assert_close(again, expected, **tol)
