"""Guards: true on the same kind of inputs, false when anything specialized on changes."""
import torch
from torch import nn

from capture_helpers import locals_for
from kiln.capture import trace


def passes(result, fn, *args, **kwargs):
    return result.guard_fn(locals_for(fn, args, kwargs), getattr(fn, "__func__", fn).__globals__)


def fn(x, y, n):
    return x * n + y


def test_tensor_and_constant_guards():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    result = trace(fn, (x, y, 3), {})
    assert "L['n'] == 3" in " ".join(result.guards)
    assert passes(result, fn, x, y, 3)
    assert passes(result, fn, torch.randn(4, 8), torch.randn(4, 8), 3)       # fresh values
    assert not passes(result, fn, x.double(), y, 3)                           # dtype
    assert not passes(result, fn, torch.randn(5, 8), y, 3)                    # shape
    assert not passes(result, fn, torch.randn(8, 4).t(), y, 3)                # stride
    assert not passes(result, fn, x.clone().requires_grad_(), y, 3)           # requires_grad
    assert not passes(result, fn, x, y, 4)                                    # constant int
    assert not passes(result, fn, x, y, 3.0)                                  # int -> float
    assert not passes(result, fn, x, y, True)                                 # int -> bool
    assert not passes(result, fn, nn.Parameter(x), y, 3)                      # exact type
    assert not passes(result, fn, [1], y, 3)                                  # not a tensor: False, no error


def test_guard_source_is_cheap_python():
    result = trace(fn, (torch.randn(4, 8), torch.randn(4, 8), 3), {})
    src = result.guard_source
    assert src.startswith("def guard(L, G):")
    # each input is loaded once into a temporary; the type check comes before attribute reads
    assert src.count("L['x']") == 1
    assert src.index("type(v") < src.index(".dtype")
    assert result.fetch_source.startswith("def fetch(L")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.drop_scale = 2.0

    def forward(self, x):
        y = self.linear(x)
        return y * self.drop_scale if self.training else y


def test_module_guards():
    m = Net()
    x = torch.randn(4, 8)
    result = trace(m.forward, (x,), {})
    assert passes(result, m.forward, torch.randn(4, 8))
    m.eval()
    assert not passes(result, m.forward, x)                       # training flag
    m.train()
    m.linear.train(False)
    assert not passes(result, m.forward, x)                       # submodule's training flag
    m.linear.train(True)
    assert passes(result, m.forward, x)
    m.drop_scale = 3.0
    assert not passes(result, m.forward, x)                       # module attribute constant
    m.drop_scale = 2.0
    other = Net()
    assert passes(result, other.forward, x)       # same structure: guarded by type, not identity
    other.linear = nn.Linear(8, 4, bias=False)
    assert not passes(result, other.forward, x)                   # its structure differs
    with torch.no_grad():
        m.linear.weight.mul_(2)                                   # in-place update: still valid
    assert passes(result, m.forward, x)
    m.linear.weight = nn.Parameter(torch.randn(4, 8).double())
    assert not passes(result, m.forward, x)                       # parameter dtype
    m.linear.weight = nn.Parameter(torch.randn(4, 8))
    assert passes(result, m.forward, x)                           # a new same-shaped parameter is fine
    handle = m.linear.register_forward_hook(lambda *a: None)
    assert not passes(result, m.forward, x)                       # hook added after capture
    handle.remove()


def test_aliased_inputs_guard():
    def add(a, b):
        return a + b

    x = torch.randn(4, 8)
    result = trace(add, (x, x), {})
    assert len(result.graph.placeholders) == 1
    assert passes(result, add, x, x)
    assert not passes(result, add, x, torch.randn(4, 8))
