"""The rest of a function after ``.item()`` that does no tensor work (``return loss.item()``
in a training step) is guarded on the float it was handed, which changes every call: after
one recompile that again holds no tensor op, it runs as plain Python. No compile per step,
no fallback, and the same results and parameters as eager."""
import torch

import kiln


def _step_fn(model, opt):
    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item() * 2
    return step


def test_a_training_step_returning_loss_item_stops_recompiling():
    torch.manual_seed(0)
    model, ref = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    ref.load_state_dict(model.state_dict())
    step = kiln.compile(_step_fn(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    ref_step = _step_fn(ref, torch.optim.SGD(ref.parameters(), lr=0.1))
    for _ in range(10):
        x = torch.randn(8, 4)
        got, want = step(x), ref_step(x)
        assert isinstance(got, float)
        assert abs(got - want) <= 1e-6 * max(1.0, abs(want)), (got, want)
    for p, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, r)
    stats = kiln.stats()
    assert stats["recompiles"] <= 1 and stats["fallbacks"] == 0, stats


def test_a_tail_with_tensor_work_keeps_its_compiled_entries():
    """Only a tail with no tensor op goes plain: ``x * loss.item()`` stays compiled (its value
    guard recompiles per value, as before) and stays correct."""
    def f(x):
        s = x.sum().item()
        return x * s

    g = kiln.compile(f)
    for _ in range(3):
        x = torch.randn(5)
        torch.testing.assert_close(g(x), f(x))
    assert kiln.stats()["graphs_compiled"] >= 3, kiln.stats()


def test_appending_an_item_breaks_once_per_iteration():
    """``vals.append(t.item())``: the glue hands the resume function ``vals.append`` on the
    stack; capture takes it as the tracked list's method (before: a second break per
    iteration, "call to list.append is not supported")."""
    def f(x, n):
        vals = []
        for _ in range(n):
            x = x * 2
            vals.append(x.sum().item())
        return x, vals

    x = torch.randn(4)
    ex = kiln.explain(f)(x, 3)
    assert ex.graph_break_count == 3, [b.reason for b in ex.break_reasons]
    got, want = kiln.compile(f)(x, 3), f(x, 3)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]
