"""``torch.LongTensor([294])`` and the other legacy tensor types, and ``torch.as_tensor``,
compile (PyTorch's test_torchinductor test_long_tensor): from data they are torch.tensor with
the type's dtype (on the CPU); from sizes an uninitialized tensor of that size; as_tensor of a
tensor is that tensor. Each matches eager in values and dtype."""
import pytest
import torch

import kiln


def long_tensor(a):
    return (torch.LongTensor([294]).to(a.device) - a, torch.as_tensor([295]).to(a.device) + a)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_long_tensor_matches_eager(dtype):
    compiled = kiln.compile(long_tensor, fullgraph=True)
    for _ in range(2):
        a = torch.randint(0, 999, (8, 8)).to(dtype)
        for got, want in zip(compiled(a), long_tensor(a)):
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("cls", [torch.FloatTensor, torch.DoubleTensor, torch.IntTensor,
                                 torch.BoolTensor, torch.ByteTensor, torch.HalfTensor])
def test_each_legacy_type_from_data(cls):
    def f(x):
        return x + cls([1, 0, 2]).to(x.dtype), cls(2, 3).shape
    x = torch.randn(3)
    got, want = kiln.compile(f, fullgraph=True)(x), f(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]
    assert kiln.compile(lambda x: cls([1, 0, 2]), fullgraph=True)(x).dtype == cls([1]).dtype


def test_as_tensor():
    def f(x):
        return torch.as_tensor(x) is x, torch.as_tensor(x, dtype=torch.float64) * 2, \
            torch.as_tensor((1.5, 2)) + x[:2]
    x = torch.randn(4)
    got, want = kiln.compile(f, fullgraph=True)(x), f(x)
    assert got[0] is True and want[0] is True
    for g, w in zip(got[1:], want[1:]):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)
