"""The backward compiled in a thread while the forward builds (autograd/speculate.py,
``config.speculative_backward``): used when the real layouts are the predicted ones, dropped
otherwise, and never the cause of an error or a wrong gradient."""
from __future__ import annotations

import copy

import pytest
import torch

import kiln
from kiln import log
from kiln.autograd import function, speculate
from testing import assert_close, randn


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(24, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)) * 1.5)


@pytest.fixture
def speculating(monkeypatch):
    monkeypatch.setattr(kiln.config, "speculative_backward", True)
    log.configure("aot")
    yield
    log.configure("")


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_speculated_backward_is_used_and_matches_eager(speculating, capsys, dtype):
    torch.manual_seed(0)
    model = MLP().to(dtype)
    ref = copy.deepcopy(model)
    f = kiln.compile(model)
    for layout in ("contiguous", "transposed"):
        x = randn((6, 24), dtype, "cpu", layout)
        f(x).square().sum().backward()
        ref(x).square().sum().backward()
        for a, b in zip(_grads(model), _grads(ref)):
            assert_close(a, b, dtype)
        model.zero_grad()
        ref.zero_grad()
    err = capsys.readouterr().err
    assert "compiling the backward of" in err and "comes from its compile during the forward's build" in err


def test_other_layouts_than_predicted_compile_again(speculating, monkeypatch, capsys):
    """A prediction that misses (simulated: the first saved tensor predicted transposed) is
    dropped; the backward compiles for the real layouts and gives eager's gradients."""
    init = speculate.BackwardSpeculation.__init__

    def mispredict(self, *args):
        init(self, *args)
        m = next(m for m in self.metas if m.ndim == 2 and m.shape[0] != m.shape[1])
        self.metas[self.metas.index(m)] = m.with_(stride=(1, m.shape[0]))
    monkeypatch.setattr(speculate.BackwardSpeculation, "__init__", mispredict)
    torch.manual_seed(0)
    model = MLP()
    ref = copy.deepcopy(model)
    x = torch.randn(7, 24)
    kiln.compile(model)(x).square().sum().backward()
    ref(x).square().sum().backward()
    for a, b in zip(_grads(model), _grads(ref)):
        assert_close(a, b, torch.float32)
    err = capsys.readouterr().err
    assert "compiled for other layouts than the real ones" in err
    assert "comes from its compile" not in err


def test_a_failing_speculation_compiles_in_the_caller(speculating, monkeypatch, capsys):
    real = function.compile_backward
    calls = []

    def flaky(*args):
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("boom in the thread")
        return real(*args)
    monkeypatch.setattr(function, "compile_backward", flaky)
    torch.manual_seed(0)
    model = MLP()
    ref = copy.deepcopy(model)
    x = torch.randn(5, 24)
    kiln.compile(model)(x).sum().backward()
    ref(x).sum().backward()
    for a, b in zip(_grads(model), _grads(ref)):
        assert_close(a, b, torch.float32)
    assert len(calls) == 2
    assert "speculative backward of" in capsys.readouterr().err


def test_off_when_switched_off_and_not_for_symbolic_sizes(monkeypatch):
    started = []
    monkeypatch.setattr(speculate.BackwardSpeculation, "start", lambda self: started.append(self.name))
    monkeypatch.setattr(kiln.config, "speculative_backward", False)
    model = MLP()
    kiln.compile(model)(torch.randn(3, 24)).sum().backward()
    assert started == []
    monkeypatch.setattr(kiln.config, "speculative_backward", True)
    kiln.reset()
    f = kiln.compile(MLP(), dynamic=True)
    f(torch.randn(3, 24)).sum().backward()
    assert started == []


def test_by_default_cuda_graphs_speculate_and_cpu_graphs_do_not(monkeypatch):
    from kiln.meta.tensor_meta import TensorMeta
    monkeypatch.setattr(kiln.config, "speculative_backward", None)
    cpu = [TensorMeta((4, 8), (8, 1), torch.float32, "cpu", True)]
    cuda = [TensorMeta((4, 8), (8, 1), torch.float32, "cuda:0", True)]
    assert not speculate.eligible(cpu)
    assert speculate.eligible(cuda)
    monkeypatch.setattr(kiln.config, "speculative_backward", True)
    assert speculate.eligible(cpu)
    monkeypatch.setattr(kiln.config, "speculative_backward", False)
    assert not speculate.eligible(cuda)
    monkeypatch.setattr(kiln.config, "debug", True)
    monkeypatch.setattr(kiln.config, "speculative_backward", None)
    assert not speculate.eligible(cuda)  # KILN_DEBUG records compiles in order
