"""torch's default dtype and device are guarded where the trace read them (issue 24, item 2):
after torch.set_default_dtype / set_default_device, a compiled factory or a float promotion
follows the new default, as eager does."""
import pytest
import torch

import kiln
from testing import CUDA


@pytest.fixture
def restore_defaults():
    yield
    torch.set_default_dtype(torch.float32)
    torch.set_default_device(None)


def _guards(cf):
    return [g for e in cf.cache.entries for g in e.guards]


def test_factory_follows_a_changed_default_dtype(restore_defaults):
    def f(x):
        return x + torch.ones(4)
    cf = kiln.compile(f)
    x = torch.randn(4)
    assert cf(x).dtype == torch.float32
    assert "torch.get_default_dtype() == torch.float32" in _guards(cf)
    torch.set_default_dtype(torch.float64)
    out = cf(x)
    assert out.dtype == f(x).dtype == torch.float64
    torch.testing.assert_close(out, f(x))
    assert kiln.stats()["recompiles"] == 1


def test_int_tensor_times_a_float_follows_the_default_dtype(restore_defaults):
    def g(i):
        return i * 1.5
    cg = kiln.compile(g)
    i = torch.arange(5)
    assert cg(i).dtype == torch.float32
    torch.set_default_dtype(torch.float64)
    torch.testing.assert_close(cg(i), g(i))
    assert cg(i).dtype == torch.float64


def test_no_default_read_no_guard():
    def h(x):
        return x * 2 + x.sin()
    ch = kiln.compile(h)
    ch(torch.randn(3))
    assert not [g for g in _guards(ch) if "default" in g]


def test_factory_follows_a_changed_default_device(restore_defaults):
    def f(n):
        return torch.zeros(n) + 1
    cf = kiln.compile(f)
    assert cf(3).device.type == "cpu"
    assert "torch.get_default_device() == torch.device('cpu')" in _guards(cf)
    torch.set_default_device("meta")
    out = cf(3)
    assert out.device.type == "meta" and f(3).device.type == "meta"
    torch.set_default_device(None)
    torch.testing.assert_close(cf(3), f(3))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_factory_follows_the_default_device_on_cuda(restore_defaults):
    def f(x):
        return x + torch.arange(4)
    cf = kiln.compile(f)
    torch.set_default_device("cuda")
    x = torch.randn(4)
    out = cf(x)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out, f(x))
