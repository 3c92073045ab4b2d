"""Sets of tensors, and ``is`` between objects of unrelated types (PyTorch's test_functions
test_set_construction, test_dataclass_factory): a tensor in a set is kept by identity (it
hashes by id), so ``set({x}); s.add(x.add_(1))`` has one element, and a constant is never
found among tensors; a dict made in the frame is never a dataclass's sentinel object. Each
compiles with fullgraph=True and matches eager."""
from dataclasses import dataclass, field
from typing import Dict

import torch

import kiln


def test_set_of_tensors_by_identity():
    def fn(x, z):
        y = x.add_(1)
        s = set({x})
        s.add(y)
        s.add(z)
        s.add(3)
        s.add(3)
        return len(s), x in s, (z * 2) in s, 1 in s, 3 in s, y * 2
    x, z = torch.randn(4), torch.randn(4)
    x2 = x.clone()
    got, want = kiln.compile(fn, fullgraph=True)(x, z), fn(x2, z)
    assert got[:5] == want[:5] == (3, True, False, False, True)
    torch.testing.assert_close(got[5], want[5])
    torch.testing.assert_close(x, x2)


@dataclass
class Output:
    scalar: int = 2
    named_tensors: Dict[str, torch.Tensor] = field(default_factory=dict)


def test_dataclass_default_factory_sentinel():
    def fn(x):
        a = Output(1)
        b = Output(5, named_tensors={"x": x})
        c = Output()
        c.named_tensors["x"] = x.sin()
        return c, x.cos() * a.scalar + b.named_tensors["x"] + c.scalar
    x = torch.randn(4)
    (c, out), (c2, out2) = kiln.compile(fn, fullgraph=True)(x), fn(x)
    assert c.scalar == c2.scalar and list(c.named_tensors) == ["x"]
    torch.testing.assert_close(c.named_tensors["x"], c2.named_tensors["x"])
    torch.testing.assert_close(out, out2)
