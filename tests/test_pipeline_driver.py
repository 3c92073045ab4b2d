"""The driver (kiln/pipeline.py): one compile runs top to bottom through compile_frame, the
backward through the same graph stages, and observers follow it through its events."""
import ast
import pathlib

import pytest
import torch

import kiln
from kiln import pipeline


@pytest.fixture
def events(monkeypatch):
    seen = []

    def record(event, ctx, **fields):
        seen.append((event, ctx.name, fields.get("compiled", "-") is None))
    monkeypatch.setattr(pipeline, "SUBSCRIBERS", [*pipeline.SUBSCRIBERS, record])
    return seen


def _mlp(x, w):
    return torch.tanh(x @ w).sum()


def test_a_training_compile_emits_the_driver_events_in_order(events):
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    ref_w = w.detach().clone().requires_grad_()
    out = kiln.compile(_mlp)(x, w)
    assert [e for e, _, _ in events] == ["started", "captured", "guards", "compiled"]
    out.backward()
    _mlp(x, ref_w).backward()
    torch.testing.assert_close(w.grad, ref_w.grad)
    assert events[4:] == [("started", "_mlp_backward", False), ("compiled", "_mlp_backward", False)]


def _breaks(x):
    y = x.sin()
    kiln.graph_break()
    return y.cos()


def test_a_graph_break_emits_compiled_without_a_graph(events):
    x = torch.randn(5)
    torch.testing.assert_close(kiln.compile(_breaks)(x), _breaks(x))
    assert events[0] == ("started", "_breaks", False)
    assert ("compiled", "_breaks", True) in events  # the compile that stopped at the break (its dump)


def test_the_backward_compiles_through_the_driver(monkeypatch):
    calls = []
    real = pipeline.compile_backward

    def spy(graph, **kw):
        calls.append(kw["name"])
        return real(graph, **kw)
    monkeypatch.setattr(pipeline, "compile_backward", spy)
    x, w = torch.randn(2, 4), torch.randn(4, 3, requires_grad=True)
    kiln.compile(_mlp)(x, w).backward()
    ref_w = w.detach().clone().requires_grad_()
    _mlp(x, ref_w).backward()
    torch.testing.assert_close(w.grad, ref_w.grad)
    assert calls == ["_mlp"]


def test_the_autograd_stage_imports_no_later_stage():
    """autograd hands its graphs back to the driver: it imports neither the driver, the api,
    the inductor, the runtime nor observe (the driver passes in what it needs)."""
    later = ("kiln.pipeline", "kiln.api", "kiln.inductor", "kiln.runtime", "kiln.observe",
             "kiln.eager_runs")
    root = pathlib.Path(pipeline.__file__).parent / "autograd"
    found = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found += [f"{path.name}:{node.lineno} {n}" for n in names
                      if any(n == m or n.startswith(m + ".") for m in later)]
    assert found == []
