"""Hooks on the compiled module itself (issue 24, item 2): pre-hooks and forward hooks of the
original module, registered before or after compiling, with kwargs or always_call, and the
global module hooks, all behave as in eager."""
import pytest
import torch
from torch import nn

import kiln


def _pair():
    torch.manual_seed(0)
    m = nn.Linear(4, 3)
    return m, kiln.compile(m)


def test_forward_hook_registered_before_compiling():
    m = nn.Linear(4, 3)
    h = m.register_forward_hook(lambda mod, i, o: o * 10)
    cm = kiln.compile(m)
    x = torch.randn(2, 4)
    torch.testing.assert_close(cm(x), m(x))
    torch.testing.assert_close(cm(x), nn.functional.linear(x, m.weight, m.bias) * 10)
    h.remove()
    torch.testing.assert_close(cm(x), m(x))  # removed: the plain output again


def test_hooks_registered_after_compiling_take_effect():
    m, cm = _pair()
    x = torch.randn(2, 4)
    torch.testing.assert_close(cm(x), m(x))
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m.register_forward_hook(lambda mod, args, out: out + args[0].sum())
    want = m(x)
    torch.testing.assert_close(cm(x), want)
    assert kiln.stats()["frames_compiled"] == 1  # the forward itself is the same compiled one


def test_kwargs_hooks_and_their_order():
    m, cm = _pair()
    seen = []

    def pre(mod, args, kwargs):
        seen.append("pre")
        return (args[0] + 1,), kwargs

    def post(mod, args, kwargs, out):
        seen.append("post")
        return out * 3

    m.register_forward_pre_hook(pre, with_kwargs=True)
    m.register_forward_hook(post, with_kwargs=True)
    m.register_forward_hook(lambda mod, args, out: seen.append("prepended") or None, prepend=True)
    x = torch.randn(2, 4)
    want = m(x)
    eager_order = list(seen)
    seen.clear()
    torch.testing.assert_close(cm(x), want)
    assert seen == eager_order == ["pre", "prepended", "post"]


def test_always_call_hook_runs_when_forward_raises():
    m, cm = _pair()
    calls = []
    m.register_forward_hook(lambda mod, args, out: calls.append(out), always_call=True)
    with pytest.raises(RuntimeError):
        m(torch.randn(2, 5))
    with pytest.raises(RuntimeError):
        cm(torch.randn(2, 5))
    assert calls == [None, None]


def test_global_forward_hooks_run_once_with_the_original_module():
    m, cm = _pair()
    seen = []
    h = nn.modules.module.register_module_forward_hook(lambda mod, i, o: seen.append(mod) or o + 1)
    try:
        x = torch.randn(2, 4)
        want = m(x)
        torch.testing.assert_close(cm(x), want)
    finally:
        h.remove()
    assert seen == [m, m]


def test_full_backward_hook_sees_the_gradient():
    m, cm = _pair()
    grads = []
    m.register_full_backward_hook(lambda mod, gin, gout: grads.append(gout[0].clone()))
    x = torch.randn(2, 4, requires_grad=True)
    (m(x) * 2).sum().backward()
    (cm(x) * 2).sum().backward()
    assert len(grads) == 2
    torch.testing.assert_close(grads[0], grads[1])


def test_hooks_on_the_compiled_wrapper_run_too():
    m, cm = _pair()
    cm.register_forward_hook(lambda mod, i, o: o - 1)
    m.register_forward_hook(lambda mod, i, o: o * 2)
    x = torch.randn(2, 4)
    torch.testing.assert_close(cm(x), m(x) - 1)
