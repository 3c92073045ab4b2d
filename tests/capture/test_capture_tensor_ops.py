"""Torch functions, Tensor methods and operators become core ops; results match eager."""
import torch
import torch.nn.functional as F

from capture_helpers import check
from kiln.ops import core


def x48():
    return (torch.randn(4, 8),)


def x_and_bias():
    return torch.randn(4, 8), torch.randn(8)


def test_seed_example():
    def fn(x, bias):
        return torch.relu(x + bias) * 2

    result = check(fn, x_and_bias)
    assert [n.target for n in result.graph.calls] == [core.add, core.relu, core.mul]
    assert result.input_sources == ["L['x']", "L['bias']"]
    # provenance: every node says which source line made it
    for node in result.graph.calls:
        assert "return torch.relu(x + bias) * 2" in node.meta["source"]
        assert node.meta["source"].startswith(__file__)


def test_torch_functions():
    def fn(x, y):
        a = torch.add(x, y, alpha=2)
        b = torch.sub(a, y)
        c = torch.sigmoid(b) * torch.tanh(x) + torch.exp(torch.neg(torch.abs(y)))
        d = torch.where(x > y, c, torch.maximum(x, y))
        e = torch.div(d, 3.0) + torch.sqrt(torch.abs(x) + 1) + torch.rsqrt(torch.abs(y) + 1)
        return torch.log(torch.abs(e) + 1) + torch.minimum(x, y) + torch.mul(x, y)

    check(fn, lambda: (torch.randn(4, 8), torch.randn(4, 8)))


def test_functional():
    def fn(x, w, b):
        return F.sigmoid(F.relu(F.linear(x, w, b))) + F.tanh(x.sum() if False else F.linear(x, w))

    check(fn, lambda: (torch.randn(4, 8), torch.randn(3, 8), torch.randn(3)))


def test_tensor_methods():
    def fn(x, y, w):
        a = x.relu().add(y, alpha=2).exp().mul(0.5)
        b = a.sub(y).div(2.0).sigmoid().tanh().neg().abs()
        c = x.mm(w).maximum(x.mm(w) * 0.5)
        return b.to(torch.float16).float() + y.half().to(torch.float32), c, x.gt(0).float().sum(dim=None) if False else x.gt(0).float()

    check(fn, lambda: (torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 8)))


def test_dtype_conversions():
    def fn(x):
        return x.to(torch.float16), x.half(), x.double(), x.to(dtype=torch.bfloat16), x.float(), x.long()

    result = check(fn, x48)
    assert sum(n.target is core.to_dtype for n in result.graph.calls) == 5  # float() is x itself


def test_python_scalars_on_both_sides():
    def fn(x):
        return (x + 1, 1 + x, x - 2.5, 2.5 - x, 3 * x, x * 3, x / 4, 4 / x, -x,
                x > 0, 0 < x, x <= 0.5, 1.0 >= x, x == 0, x != 0)

    check(fn, x48)


def test_tensor_operators():
    def fn(x, y, w):
        z = x @ w
        return (x + y) * (x - y) / (y * y + 1) + z, x < y, x >= y, x == y


    check(fn, lambda: (torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 8)))


def test_inplace_operators_on_intermediates():
    def fn(x, y):
        z = x * 2
        alias = z
        z += y
        z *= 3
        n = 1
        n += 2
        return z, alias, z * n

    result = check(fn, lambda: (torch.randn(4, 8), torch.randn(4, 8)))
    assert result.graph.output_node.args[0][0] is result.graph.output_node.args[0][1]


def test_tensor_metadata_is_constant():
    def fn(x):
        n = x.shape[0] * x.size(1) + x.ndim + x.dim() + x.size()[1] + len(x)
        if x.dtype == torch.float32 and x.device.type == "cpu":
            return x * n
        return x

    result = check(fn, x48)
    assert [n.target for n in result.graph.calls] == [core.mul]
    assert result.graph.calls[0].args[1] == 4 * 8 + 2 + 2 + 8 + 4


def test_returns_input_unchanged():
    def fn(x, y):
        return x, y + 1

    result = check(fn, lambda: (torch.randn(4, 8), torch.randn(4, 8)))
    assert result.graph.output_node.args[0][0] is result.graph.placeholders[0]


def test_isinstance_and_none():
    def fn(x, y=None):
        if y is None and isinstance(x, torch.Tensor) and not isinstance(x, (int, float)):
            return x.relu()
        return x + y

    result = check(fn, x48)
    assert [n.target for n in result.graph.calls] == [core.relu]
