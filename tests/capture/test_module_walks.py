"""``modules()``, ``named_modules()``, ``parameters()``, ``named_parameters()``, ``buffers()``,
``named_buffers()`` inside a compiled forward (kiln/capture/module_walks.py): torch's
generators, computed at trace time and guarded on the tables they read. They broke and ran
the rest of the forward eagerly (``next(self.parameters()).dtype``; transformers' ``self.dtype``
in LayoutLM and MarkupLM)."""
import torch

import kiln
from testing import assert_close


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.sub = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        self.shared = self.fc  # one module under two names: yielded once
        self.register_buffer("scale", torch.tensor(2.0))
        self.empty = None

    def forward(self, x):
        p = next(self.parameters())
        n_mod = sum(1 for _ in self.modules())
        names = [k for k, _ in self.named_modules()]
        n_par = len(list(self.named_parameters()))
        n_all = len(list(self.named_parameters(remove_duplicate=False)))
        own = len(list(self.parameters(recurse=False)))
        bufs = [b for _, b in self.named_buffers()]
        y = self.sub(self.fc(x)).to(p.dtype) * bufs[0]
        return y * n_mod + len(names) + 10 * n_par + 100 * n_all + 1000 * own


def test_walks_are_one_graph_and_match_eager():
    m = Net()
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = m(x)
        out = kiln.explain(m)(x)
        assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
        assert_close(out.result, want, torch.float32)
        assert_close(kiln.compile(m)(x), want, torch.float32)
    assert kiln.stats()["eager_runs"] == 0


def test_a_changed_module_tree_recompiles():
    m = Net()
    f = kiln.compile(m)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert_close(f(x), m(x), torch.float32)
        m.sub.append(torch.nn.Linear(4, 4))   # one more module and two more parameters
        assert_close(f(x), m(x), torch.float32)
        m.empty = torch.nn.Tanh()             # a None entry that is now a module
        assert_close(f(x), m(x), torch.float32)
        m.register_parameter("extra", torch.nn.Parameter(torch.ones(1)))
        assert_close(f(x), m(x), torch.float32)
    assert kiln.stats()["recompiles"] == 3, kiln.stats()
