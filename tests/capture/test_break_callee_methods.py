"""A graph break inside a method of a plain object the frame reaches (``opt.step()`` of an
optimizer whose step branches on a number read from a tensor) resumes in compiled code: the
method is compiled on its own and bound, at run time, to the object the call reaches. Before,
only functions and modules' methods were; the rest of such a call ran eagerly (with a warning).
"""
import copy

import torch

import kiln


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        y = x * self.k
        if y.sum().item() > 0:  # data-dependent: a break inside the method
            return y + 1
        return y - 1


def test_a_break_inside_an_object_s_method_resumes_compiled():
    kiln.reset()
    s = Scaler(2.0)

    def fn(x):
        return s.apply(x * 3) * 2
    compiled = kiln.compile(fn)
    for sign in (1, -1, 1):
        x = torch.rand(4) * sign
        torch.testing.assert_close(compiled(x), fn(x))
    stats = kiln.stats()
    assert stats["eager_runs"] == 0 and stats["graph_breaks"] >= 1


def test_radam_step_compiles_around_its_branch():
    kiln.reset()
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(2)]
    ref = copy.deepcopy(ps)
    opt, ref_opt = torch.optim.RAdam(ps, lr=0.05), torch.optim.RAdam(ref, lr=0.05)
    step = kiln.compile(lambda: opt.step())
    for i in range(8):  # rho_t passes 5 at step 6: both ways of the branch
        grads = [torch.randn(4, 3) for _ in ps]
        for p, q, g in zip(ps, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        step()
        ref_opt.step()
        for p, q in zip(ps, ref):
            torch.testing.assert_close(p, q)
    assert kiln.stats()["eager_runs"] == 0


def test_torch_s_disable_dynamo_wrapper_runs_natively():
    """``torch._disable_dynamo(fn)`` (torch's ``Optimizer.zero_grad``) is one break at the call,
    run natively: traced, its wrapper broke four times (its lazy import of Dynamo, its attribute
    cache) before reaching the call, and its method form compiled a frame per break."""
    kiln.reset()

    @torch._disable_dynamo
    def bump(t):
        t.add_(1)
        return t.sum().item()

    def fn(x, buf):
        y = x * 2
        s = bump(buf)
        return y + s

    x = torch.randn(3)
    e = kiln.explain(fn)(x, torch.zeros(3))
    assert e.graph_break_count == 1, e.break_reasons
    assert "_disable_dynamo" in e.break_reasons[0].reason, e.break_reasons
    mine, theirs = torch.zeros(3), torch.zeros(3)
    compiled = kiln.compile(fn)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, mine), fn(x, theirs))
        torch.testing.assert_close(mine, theirs)


def test_optimizer_zero_grad_is_one_break_at_the_call():
    kiln.reset()
    m = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def f(x):
        y = m(x).sum()
        opt.zero_grad()
        return y * 2
    x = torch.randn(2, 3)
    m.weight.grad = torch.ones(3, 3)
    e = kiln.explain(f)(x)
    assert e.graph_break_count == 1, e.break_reasons
    assert "zero_grad" in e.break_reasons[0].reason and "_disable_dynamo" in e.break_reasons[0].reason
    m.weight.grad = torch.ones(3, 3)
    torch.testing.assert_close(kiln.compile(f)(x), f(x))
    assert m.weight.grad is None
