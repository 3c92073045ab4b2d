"""Tensor attributes that are tensors (.T, .mT) and the ~ operator on tensors."""
import torch

import kiln
from testing import assert_close


def test_transpose_attributes_and_invert():
    def f(x, m, b):
        return x.T * 2 + x.mT.sum(), ~m, ~b, ~3
    x = torch.randn(4, 4)
    m = torch.rand(4) > 0.5
    b = torch.randint(-5, 5, (4,))
    got = kiln.compile(f, fullgraph=True)(x, m, b)
    want = f(x, m, b)
    assert_close(got[0], want[0])
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert got[3] == want[3] == -4


def test_batched_mT_grad():
    x = torch.randn(2, 3, 4, requires_grad=True)
    out = kiln.compile(lambda x: (x.mT @ x).sum())(x)
    out.backward()
    ref = x.detach().clone().requires_grad_()
    (ref.mT @ ref).sum().backward()
    assert_close(x.grad, ref.grad)
