"""In-place random fills (``uniform_``, ``exponential_``, ``normal_``) in the graph, as Dynamo
captures them: PhiMoE's router draws ``empty_like(g).exponential_()`` and ``uniform_`` in
training (34 graphs / 25 breaks before; Dynamo 1 / 0). The values are random, so the checks
are their ranges and moments over many draws, and that the graph compiles once."""
import pytest
import torch

import kiln


def draws(x):
    e = torch.empty_like(x).exponential_()
    u = torch.rand_like(x).uniform_() > 0.75
    jitter = x * torch.empty_like(x).uniform_(0.9, 1.1)
    n = torch.empty_like(x).normal_(2.0, 0.5)
    return e, u, jitter, n


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_random_fills_are_one_graph_with_the_right_distributions(backend):
    x = torch.randn(128, 128).abs() + 0.1
    kiln.reset()
    out = kiln.explain(draws, backend=backend)(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    e, u, jitter, n = out.result
    assert e.min() >= 0 and abs(e.mean().item() - 1.0) < 0.05
    assert abs(u.float().mean().item() - 0.25) < 0.02
    ratio = jitter / x
    assert ratio.min() >= 0.9 - 1e-6 and ratio.max() <= 1.1 + 1e-6
    assert abs(n.mean().item() - 2.0) < 0.02 and abs(n.std().item() - 0.5) < 0.02


def test_gradient_flows_past_a_jitter():
    w = torch.randn(4, 4, requires_grad=True)

    def f(x):
        h = x @ w
        h = h * torch.empty_like(h).uniform_(1.0, 1.0)  # a jitter of width 0: the identity
        return h.sum()
    x = torch.randn(3, 4)
    kiln.reset()
    kiln.compile(f)(x).backward()
    torch.testing.assert_close(w.grad, x.sum(0)[:, None].expand(4, 4))


def test_fill_of_an_input_is_written_back():
    x = torch.full((1000,), 5.0)
    kiln.reset()
    out = kiln.compile(lambda t: t.uniform_(2.0, 3.0))(x)
    assert out is x and x.min() >= 2.0 and x.max() <= 3.0 and x.std() > 0.2
    assert kiln.stats()["graph_breaks"] == 0


def test_integer_tensor_runs_eagers_error():
    def f(x):
        return torch.empty_like(x).uniform_()
    kiln.reset()
    with pytest.raises((RuntimeError, NotImplementedError)):
        kiln.compile(f, backend="eager")(torch.zeros(3, dtype=torch.int64))
