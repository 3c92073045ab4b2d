"""``Module.children()`` and ``named_children()`` in a forward (timm's RegNet and other stages
loop ``for block in self.children()``): one graph, guarded on the submodules' names, where the
generator was a graph break and an eager run of every stage."""
import torch

import kiln


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + x


class Stage(torch.nn.Module):
    def __init__(self, c, n):
        super().__init__()
        for i in range(n):
            self.add_module(f"b{i + 1}", Block(c))

    def forward(self, x):
        for block in self.children():
            x = block(x)
        return x


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.s1 = Stage(8, 2)
        self.gap = None  # a None entry in _modules: torch's generators skip it
        self.s2 = Stage(8, 3)

    def forward(self, x):
        names = []
        for name, stage in self.named_children():
            x = stage(x)
            names.append(name)
        return x, names


def test_children_loops_are_one_graph_matching_eager():
    torch.manual_seed(0)
    for train in (False, True):
        m = Net().train(train)
        x = torch.randn(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
        kiln.reset()
        out = kiln.explain(m)(x)
        assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
        kiln.reset()
        (got, got_names), (want, want_names) = kiln.compile(m)(x), m(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert got_names == want_names == ["s1", "s2"]
        assert kiln.stats()["eager_runs"] == 0


def test_a_new_submodule_changes_what_children_yields():
    torch.manual_seed(0)
    m = Stage(4, 2).eval()
    x = torch.randn(1, 4, 5, 5)
    c = kiln.compile(m)
    torch.testing.assert_close(c(x), m(x))
    m.add_module("b3", Block(4).eval())  # the guard on the names sees the third block
    torch.testing.assert_close(c(x), m(x))
    del m._modules["b1"]
    torch.testing.assert_close(c(x), m(x))


def test_an_overridden_children_is_inlined_not_taken_for_torchs():
    class Reversed(Stage):
        def children(self):
            return reversed(list(self._modules.values()))

    torch.manual_seed(0)
    m = Reversed(4, 3).eval()
    x = torch.randn(1, 4, 5, 5)
    torch.testing.assert_close(kiln.compile(m)(x), m(x))
