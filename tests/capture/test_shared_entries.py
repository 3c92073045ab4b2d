"""Identical module instances share one compiled entry (issue 25): modules are guarded by type
and structure, their parameters and buffers are graph inputs read per call, so each instance
computes with its own weights."""
import copy

import pytest
import torch
from torch import nn

import kiln
from kiln.capture import trace


class Block(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)
        self.register_buffer("shift", torch.randn(d))

    def forward(self, x):
        return x + torch.relu(self.fc(self.ln(x))) + self.shift


class BrokenBlock(nn.Module):
    """A block whose forward breaks: its rest runs in a resume function, called per block."""

    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        h = self.fc(x)
        kiln.graph_break()
        return x + torch.tanh(h)


class Stack(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def test_twelve_wrapped_blocks_compile_once_each_with_its_own_weights():
    blocks = [Block() for _ in range(12)]
    compiled = [kiln.compile(b) for b in blocks]
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        outs = [c(x) for c in compiled]
        for b, out in zip(blocks, outs):
            torch.testing.assert_close(out, b(x))
    stats = kiln.stats()
    assert stats["frames_compiled"] == 1 and stats["recompiles"] == 0
    assert stats["cache_hits"] == 11 and stats["fallbacks"] == 0
    # distinct weights really were used: the outputs differ block to block
    assert not torch.allclose(outs[0], outs[1])


def test_training_through_twelve_wrapped_blocks_gives_each_block_its_grads():
    torch.manual_seed(0)
    blocks = [Block() for _ in range(12)]
    ref = copy.deepcopy(blocks)
    compiled = [kiln.compile(b) for b in blocks]
    x = torch.randn(2, 3, 8, requires_grad=True)  # every block's input requires grad alike
    h, r = x, x
    for c, b in zip(compiled, ref):
        h, r = c(h), b(r)
    torch.testing.assert_close(h, r)
    h.square().mean().backward()
    r.square().mean().backward()
    for b, e in zip(blocks, ref):
        for (name, p), q in zip(b.named_parameters(), e.parameters()):
            assert p.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert kiln.stats()["frames_compiled"] == 1


@pytest.mark.parametrize("change", ["shape", "dtype", "requires_grad", "eval", "buffer_shape"])
def test_a_block_that_differs_recompiles(change):
    x = torch.randn(2, 8)
    first, other = Block(), Block()
    if change == "shape":
        other.fc = nn.Linear(8, 8, bias=False)
    elif change == "dtype":
        other.double()
        x2 = x.double()
    elif change == "requires_grad":
        other.fc.weight.requires_grad_(False)
    elif change == "eval":
        other.eval()
    elif change == "buffer_shape":
        other.shift = torch.randn(1)
    f, g = kiln.compile(first, backend="eager"), kiln.compile(other, backend="eager")
    torch.testing.assert_close(f(x), first(x))
    y = x2 if change == "dtype" else x
    torch.testing.assert_close(g(y), other(y))
    assert kiln.stats()["frames_compiled"] == 2 and kiln.stats()["recompiles"] == 1
    torch.testing.assert_close(f(x), first(x))  # both entries stay
    torch.testing.assert_close(g(y), other(y))
    assert kiln.stats()["frames_compiled"] == 2


def test_one_forward_reached_through_twelve_selves_after_a_break():
    """Block.forward's rest after the break is one resume code reached through twelve ``self``s:
    before, identity guards gave an entry per block until the recompile limit, then eager."""
    net = Stack([BrokenBlock() for _ in range(12)])
    f = kiln.compile(net, backend="eager")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 8)
            torch.testing.assert_close(f(x), net(x))
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["eager_runs"] == 0
    assert stats["frames_compiled"] <= 6, stats  # not one per block


def test_shared_submodule_is_guarded_to_stay_shared():
    class Twice(nn.Module):
        def __init__(self, a, b):
            super().__init__()
            self.a, self.b = a, b

        def forward(self, x):
            if self.a is self.b:
                return self.a(x) * 2
            return self.a(x) + self.b(x)

    lin = nn.Linear(4, 4)
    shared, apart = Twice(lin, lin), Twice(nn.Linear(4, 4), nn.Linear(4, 4))
    f, g = kiln.compile(shared, backend="eager"), kiln.compile(apart, backend="eager")
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(f(x), shared(x))
        torch.testing.assert_close(g(x), apart(x))
        torch.testing.assert_close(f(x), shared(x))
    assert kiln.stats()["frames_compiled"] == 2


def test_reduce_overhead_keeps_identity_guards():
    """A CUDA graph reads parameters in place: under mode="reduce-overhead" each instance keeps
    an entry (and a recording) of its own."""
    m = Block()
    shared = trace(m.forward, (torch.randn(2, 8),), {})
    own = trace(m.forward, (torch.randn(2, 8),), {}, module_identity=True)
    assert not any(g.startswith("id(L['self']) ==") for g in shared.guards)
    assert any(g.startswith("id(L['self']) ==") for g in own.guards)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_twelve_wrapped_blocks_on_cuda_train_with_their_own_weights():
    torch.manual_seed(0)
    blocks = [Block().cuda() for _ in range(12)]
    ref = copy.deepcopy(blocks)
    compiled = [kiln.compile(b) for b in blocks]
    x = torch.randn(4, 16, 8, device="cuda", requires_grad=True)
    h, r = x, x
    for c, b in zip(compiled, ref):
        h, r = c(h), b(r)
    torch.testing.assert_close(h, r, rtol=1e-4, atol=1e-4)
    h.sum().backward()
    r.sum().backward()
    for b, e in zip(blocks, ref):
        for p, q in zip(b.parameters(), e.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4)
    assert kiln.stats()["frames_compiled"] == 1


def test_an_instance_with_a_forward_of_its_own_does_not_share_the_entry():
    """accelerate-style hooks replace ``module.forward`` on one instance."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x)

    plain, hooked = Net(), Net()
    original = hooked.block.forward

    def doubled(x):
        return original(x) * 2
    hooked.block.forward = doubled
    f, g = kiln.compile(plain, backend="eager"), kiln.compile(hooked, backend="eager")
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(f(x), plain(x))
        torch.testing.assert_close(g(x), hooked(x))
