"""A Python float that changes between calls becomes a graph input after its first change
(issue 25), with torch's "wrapped number" promotion: ``half * 0.5`` stays half, ``int * 0.5``
is the default float dtype. See kiln/capture/dynamic_floats.py."""
import math

import pytest
import torch
from torch import nn

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def scale_shift(x, s):
    return torch.relu(x) * s + s


def _inputs(dtype):
    x = torch.randn(4, 5) * 10
    return x.to(dtype)


@pytest.mark.parametrize("backend", ["eager", "kiln"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.float64])
def test_a_changing_float_argument_compiles_at_most_twice(dtype, backend):
    f = kiln.compile(scale_shift, backend=backend)
    for i in range(10):
        x, s = _inputs(dtype), 0.5 + 0.37 * i
        out, ref = f(x, s), scale_shift(x, s)
        assert out.dtype == ref.dtype, (out.dtype, ref.dtype)  # a number never widens the tensor
        torch.testing.assert_close(out, ref)
    stats = kiln.stats()
    assert stats["frames_compiled"] <= 2 and stats["fallbacks"] == 0, stats
    assert not [c for c in kiln.api._CODE_CACHES.values() if c.eager_reason]


def test_a_zero_dim_half_tensor_stays_half():
    f = kiln.compile(scale_shift)
    for i in range(4):
        x = torch.tensor(3.0 + i, dtype=torch.float16)
        out, ref = f(x, 0.1 * i + 0.3), scale_shift(x, 0.1 * i + 0.3)
        assert out.dtype == ref.dtype == torch.float16
        torch.testing.assert_close(out, ref)
    assert kiln.stats()["frames_compiled"] <= 2


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.scale = 1.0

    def forward(self, x):
        return self.fc(x) * self.scale


def test_a_changing_float_attribute_becomes_an_input_and_trains():
    m = Scaled()
    f = kiln.compile(m)
    for i in range(6):
        m.scale = 1.0 + 0.25 * i
        x = torch.randn(3, 6, requires_grad=True)
        out, ref = f(x), m(x)
        torch.testing.assert_close(out, ref)
        g = torch.randn_like(out)
        (gx,) = torch.autograd.grad(out, x, g)
        (rx,) = torch.autograd.grad(ref, x, g)
        torch.testing.assert_close(gx, rx)
    assert kiln.stats()["frames_compiled"] <= 2, kiln.stats()


def returns_the_float(x, s):
    t = s * 2 + 1  # Python arithmetic on the float: double precision, a float again
    return x * s, t, s


def test_float_results_come_back_as_python_floats():
    f = kiln.compile(returns_the_float, backend="eager")
    for i in range(4):
        x, s = torch.randn(3), 0.1 + 1e-9 * i + i / 3
        out, ref = f(x, s), returns_the_float(x, s)
        torch.testing.assert_close(out[0], ref[0])
        assert type(out[1]) is float and type(out[2]) is float
        assert out[1] == ref[1] and out[2] == ref[2]  # exactly: computed in float64
    assert kiln.stats()["frames_compiled"] <= 2


def branches_on_the_float(x, p):
    if p > 0.5:
        return x * p
    return x - math.sqrt(p)


def test_a_float_needed_as_a_python_number_stays_a_constant():
    f = kiln.compile(branches_on_the_float, backend="eager")
    for p in (0.1, 0.2, 0.7, 0.9):
        x = torch.randn(3)
        torch.testing.assert_close(f(x, p), branches_on_the_float(x, p))
    stats = kiln.stats()
    assert stats["frames_compiled"] == 4 and stats["fallbacks"] == 0, stats


def float_through_a_break(x, s):
    y = x * s
    print("step")
    return y + s


def test_a_float_passed_over_a_graph_break(capsys):
    f = kiln.compile(float_through_a_break, backend="eager")
    for i in range(6):
        x, s = torch.randn(3), 0.3 + 0.1 * i
        torch.testing.assert_close(f(x, s), float_through_a_break(x, s))
    assert kiln.stats()["frames_compiled"] <= 4, kiln.stats()  # the frame and its rest, twice each


def test_dynamic_false_keeps_floats_constant():
    f = kiln.compile(scale_shift, backend="eager", dynamic=False)
    for i in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(f(x, 0.5 + i), scale_shift(x, 0.5 + i))
    assert kiln.stats()["frames_compiled"] == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_changing_float_with_cuda_tensors(dtype):
    f = kiln.compile(scale_shift)
    for i in range(5):
        x = torch.randn(64, 33, device="cuda").to(dtype)
        s = 0.25 + 0.5 * i
        out, ref = f(x, s), scale_shift(x, s)
        assert out.dtype == ref.dtype and out.device == ref.device
        torch.testing.assert_close(out, ref)
    assert kiln.stats()["frames_compiled"] <= 2 and kiln.stats()["fallbacks"] == 0
