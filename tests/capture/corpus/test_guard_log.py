"""Every guard failure recompiles and is logged under `recompiles` in plain words that name the
guard: globals, module attributes and flags, constant arguments, list lengths, grad mode."""
import contextlib
import logging

import pytest
import torch
from torch import nn

import kiln
from kiln import log

MODE = "relu"


@contextlib.contextmanager
def recompile_log():
    lines = []

    class Grab(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = Grab()
    logger = logging.getLogger("kiln.recompiles")
    saved = dict(log._enabled), log._configured
    log.configure("recompiles")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        log._enabled.clear()
        log._enabled.update(saved[0])
        log._configured = saved[1]


def uses_global(x):
    return x.relu() if MODE == "relu" else x.tanh()


def scaled(x, n, sizes):
    return x * n + len(sizes)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = 2.0

    def forward(self, x):
        y = self.lin(x) * self.scale
        return y * 2 if self.training else y


def _run_twice(fn, change, args):
    with recompile_log() as lines:
        out1 = fn(*args)
        change()
        out2 = fn(*args)
    return out1, out2, lines


@pytest.mark.parametrize("backend", ["eager"])
def test_global_value_guard(backend):
    global MODE
    x = torch.randn(4, 8)
    f = kiln.compile(uses_global, backend=backend)
    try:
        out1, out2, lines = _run_twice(f, lambda: globals().__setitem__("MODE", "tanh"), (x,))
    finally:
        MODE = "relu"
    torch.testing.assert_close(out1, x.relu())
    torch.testing.assert_close(out2, x.tanh())
    assert any("MODE changed: was 'relu', now 'tanh'" in line for line in lines), lines


def test_training_flag_guard():
    m = Net()
    x = torch.randn(4, 8)
    f = kiln.compile(m, backend="eager")
    out1, out2, lines = _run_twice(f, m.eval, (x,))
    m2 = Net()
    m2.load_state_dict(m.state_dict())
    torch.testing.assert_close(out2, m2.eval()(x))
    assert any("self.training changed: was True, now False" in line for line in lines), lines
    assert not torch.allclose(out1, out2)


def test_submodule_flag_and_attribute_guards():
    m = Net().eval()
    x = torch.randn(4, 8)
    f = kiln.compile(m, backend="eager")
    with recompile_log() as lines:
        f(x)
        m.lin.train()
        f(x)
        m.scale = 3.0
        out = f(x)
    assert any("self.lin.training changed: was False, now True" in line for line in lines), lines
    assert any("self.scale changed: was 3.0" not in line and "self.scale changed: was 2.0, now 3.0" in line
               for line in lines), lines
    torch.testing.assert_close(out, m(x))


def test_constant_argument_and_list_length_guards():
    x = torch.randn(4, 8)
    f = kiln.compile(scaled, backend="eager")
    with recompile_log() as lines:
        f(x, 2, [1])
        f(x, 3, [1])
        out = f(x, 3, [1, 2])
        f(x, 3.0, [1, 2])
    assert any("n changed: was 2, now 3" in line for line in lines), lines
    assert any("len(sizes) changed: was 1, now 2" in line for line in lines), lines
    # after its change n is a dynamic int (guarded by type): a float names the type change
    assert any("the type of n changed: now float" in line for line in lines), lines
    torch.testing.assert_close(out, x * 3 + 2)


def test_tensor_guard_words():
    x = torch.randn(4, 8)
    f = kiln.compile(scaled, backend="eager")
    with recompile_log() as lines:
        f(x, 2, [1])
        f(x.double(), 2, [1])
    assert any("x.dtype changed: was torch.float32, now torch.float64" in line for line in lines), lines


def test_grad_mode_guard():
    w = torch.randn(4, 8, requires_grad=True)

    def fn(x):
        return x * w

    f = kiln.compile(fn, backend="eager")
    x = torch.randn(4, 8)
    with recompile_log() as lines:
        out1 = f(x)
        with torch.no_grad():
            out2 = f(x)
    assert out1.requires_grad and not out2.requires_grad
    assert any("torch.is_grad_enabled() changed: was True, now False" in line for line in lines), lines


def test_a_tensor_on_another_device_is_named_in_plain_words():
    from kiln.capture.guards import GuardSet, LocalSource, explain_failure
    g = GuardSet()
    x = torch.randn(3)
    g.tensor(LocalSource("x"), x)
    guard = g.compile()[1]
    assert guard({"x": torch.randn(3)}, {})
    moved = torch.empty(3, device="meta")
    assert not guard({"x": moved}, {})
    assert explain_failure(g, {"x": moved}, {}) == "x is on meta now"
    cuda = GuardSet()
    cuda.tensor(LocalSource("x"), torch.empty(3, device="meta"))
    assert not cuda.compile()[1]({"x": x}, {})
    assert explain_failure(cuda, {"x": x}, {}) == "x is on cpu now"
