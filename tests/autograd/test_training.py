"""Training through kiln.compile: torch.autograd.Function glue, optimizers, gradient
accumulation, no_grad evaluation, train/eval switches, inputs and outputs with and without
grad, double backward, logs and the debug dump."""
from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

import kiln
from kiln.autograd import DOUBLE_BACKWARD_ERROR, CompiledAutograd
from kiln.ops import core, registry
from kiln.ops.registry import META_RULES, MissingRule
from kiln.pipeline import StageError, compile_graph

from autograd_helpers import trace_core
from testing import assert_close

BACKENDS = ["aot_eager", "kiln"]


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.act(self.fc1(x))
        if self.training:  # a Python branch on module state: guarded, never a wrong answer
            h = h * 0.5
        return self.fc2(h)


def mse(out, y):
    d = out - y
    return (d * d).mean()


def loss_of(model, x, y):
    return mse(model(x), y)


@pytest.fixture(autouse=True)
def _no_fallbacks():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager fails the test
        with kiln.config.patch(strict=True):
            yield


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
@pytest.mark.parametrize("whole_loss", [False, True], ids=["module", "loss_fn"])
def test_mlp_training_matches_eager(backend, opt, whole_loss):
    torch.manual_seed(0)
    eager = MLP()
    ours = copy.deepcopy(eager)
    if whole_loss:
        run_loss = kiln.compile(loss_of, backend=backend)
        run_model = kiln.compile(ours, backend=backend)
    else:
        run_model = kiln.compile(ours, backend=backend)
        run_loss = lambda m, x, y: mse(run_model(x), y)  # noqa: E731
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2)}[opt]
    opt_e, opt_o = make(eager.parameters()), make(ours.parameters())
    x_eval = torch.randn(3, 8)
    for step in range(3):
        batches = [(torch.randn(5, 8), torch.randn(5, 4)) for _ in range(2)]
        for model, optim, loss_fn, forward in ((eager, opt_e, loss_of, eager),
                                               (ours, opt_o, run_loss, run_model)):
            model.train()
            optim.zero_grad()
            for x, y in batches:  # gradient accumulation over two micro-batches
                (loss_fn(model, x, y) / 2).backward()
            optim.step()
            model.eval()
            with torch.no_grad():
                model.eval_out = forward(x_eval)
        assert_close(ours.eval_out, eager.eval_out, torch.float32)
        for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["graph_breaks"] == 0, stats


@pytest.mark.parametrize("backend", BACKENDS)
def test_grads_flow_to_an_input_that_requires_grad(backend):
    @kiln.compile(backend=backend)
    def f(x, w):
        return torch.tanh(x * w) + x

    x = torch.randn(4, 5, requires_grad=True)
    w = torch.randn(5, requires_grad=True)
    x_e, w_e = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    f(x, w).sum().backward()
    (torch.tanh(x_e * w_e) + x_e).sum().backward()
    assert_close(x.grad, x_e.grad)
    assert_close(w.grad, w_e.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_that_do_not_require_grad(backend):
    @kiln.compile(backend=backend)
    def f(x, k):
        return torch.exp(x), x > 0, k * 2

    x = torch.randn(4, 5, requires_grad=True)
    k = torch.randn(4, 5)
    e, mask, k2 = f(x, k)
    assert e.requires_grad and not mask.requires_grad and not k2.requires_grad
    assert mask.dtype == torch.bool
    assert_close(k2, k * 2)
    e.sum().backward()  # the other outputs' tangents are None
    assert_close(x.grad, torch.exp(x.detach()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_unused_outputs_and_partial_tangents(backend):
    @kiln.compile(backend=backend)
    def f(x):
        return torch.sigmoid(x), torch.tanh(x)

    x = torch.randn(6, requires_grad=True)
    a, b = f(x)
    b.sum().backward()  # a's tangent is None and gets materialized as zeros
    assert_close(x.grad, 1 - torch.tanh(x.detach()) ** 2)


def test_no_output_carries_a_gradient():
    @kiln.compile(backend="aot_eager")
    def f(x):
        return x > 0

    x = torch.randn(5, requires_grad=True)
    assert torch.equal(f(x), x.detach() > 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_double_backward_raises_a_clear_error(backend):
    @kiln.compile(backend=backend)
    def f(x):
        return torch.sigmoid(x) * x

    x = torch.randn(5, requires_grad=True)
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward through a compiled graph is not supported"):
        g.sum().backward()
    assert DOUBLE_BACKWARD_ERROR.startswith("kiln:")


def test_backward_is_compiled_lazily_once():
    x = torch.randn(4, 4, requires_grad=True)
    compiled = compile_graph(trace_core(lambda x: core.exp(core.mul(x, x)), x), "kiln")
    assert isinstance(compiled, CompiledAutograd)
    (y,) = compiled(x)
    assert not compiled._backward  # not compiled before the first backward
    y.sum().backward()
    assert len(compiled._backward) == 1
    (y,) = compiled(x)
    y.sum().backward()
    assert len(compiled._backward) == 1
    assert_close(x.grad, 2 * 2 * x.detach() * torch.exp(x.detach() ** 2))


def test_missing_vjp_rule_names_op_and_stage():
    op = registry.define("test_autograd", "novjp", lambda x: x * 3)
    META_RULES[op] = lambda x: x
    x = torch.randn(3, requires_grad=True)
    graph = trace_core(lambda x: op(x), x)
    from kiln.autograd import build_joint
    with pytest.raises(MissingRule, match=r"\[vjp\].*test_autograd.novjp"):
        build_joint(graph)
    with pytest.raises(StageError, match="autograd.*vjp.*test_autograd.novjp"):
        compile_graph(trace_core(lambda x: op(x), x), "aot_eager")


def test_aot_log_prints_graphs_and_saved_bytes(capsys):
    kiln.log.configure("aot")
    try:
        @kiln.compile(backend="aot_eager")
        def f(x, w):
            return torch.sigmoid(x * w)

        f(torch.randn(4, 4, requires_grad=True), torch.randn(4, requires_grad=True))
    finally:
        kiln.log.configure("")
    err = capsys.readouterr().err
    assert "forward graph of" in err and "backward graph of" in err
    assert "saved for backward (min_cut partitioner)" in err and "bytes" in err


def test_debug_dump_has_forward_and_backward_graphs(tmp_path):
    import kiln.observe.debug as debug
    debug._run_dir = None
    try:
        with kiln.config.patch(debug=True, debug_dir=str(tmp_path)):
            @kiln.compile(backend="aot_eager")
            def f(x):
                return torch.tanh(x) * x
            f(torch.randn(3, requires_grad=True)).sum().backward()
    finally:
        debug._run_dir = None
    files = [f for _, _, fs in os.walk(tmp_path) for f in fs]
    assert "02a_forward_graph.py" in files and "02b_backward_graph.py" in files
    folders = sorted(d for _, ds, _ in os.walk(tmp_path) for d in ds)
    assert any(d.endswith("_backward") for d in folders), folders  # the lazy backward compile
    for root, _, fs in os.walk(tmp_path):  # the dumped graphs run on random inputs
        for name in fs:
            if name.startswith(("02a", "02b")):
                import runpy
                runpy.run_path(os.path.join(root, name), run_name="__main__")
    import json
    metrics = [json.load(open(os.path.join(r, f))) for r, _, fs in os.walk(tmp_path) for f in fs
               if f == "metrics.json"]
    forward = [m for m in metrics if not m["name"].endswith("_backward")]
    assert forward and "autograd" in forward[0]["stage_seconds"]
