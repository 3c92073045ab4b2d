"""torch.compile(m, backend="kiln"): Dynamo captures, kiln compiles (kiln/interop/).

Every case compares with eager on fresh random inputs, and checks that kiln generated kernels
and that nothing ran eagerly (kiln.stats()["eager_runs"])."""
from __future__ import annotations

import copy
import importlib
import importlib.metadata
import pathlib
import sys
import tomllib
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.interop
from testing import assert_close

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "models"))
from model_helpers import loss_of, tensors_of  # noqa: E402

transformers = pytest.importorskip("transformers")
BACKEND = kiln.interop.backend
ROOT = pathlib.Path(__file__).parents[2]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _entry_point_installed() -> bool:
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    return any(ep.name == "kiln" and ep.value == "kiln.interop:backend" for ep in eps)


BACKENDS = [pytest.param(BACKEND, id="callable"),
            pytest.param("kiln", id="string", marks=pytest.mark.skipif(
                not _entry_point_installed(),
                reason="the installed kiln's metadata has no torch_dynamo_backends entry point "
                       "(pip install -e . again after this commit)"))]


def _assert_compiled_by_kiln(graphs=None):
    stats = kiln.stats()
    assert stats["kernels_generated"] > 0, stats
    assert stats["eager_runs"] == 0 and stats["fallbacks"] == 0, stats
    if graphs is not None:
        assert stats["graphs_compiled"] == graphs, stats
    return stats


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32,
                                  bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg), (torch.randint(0, 128, (2, 8)),)


def _resnet():
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                    layer_type="basic")
    return transformers.ResNetModel(cfg), (torch.randn(2, 3, 32, 32),)


def _llama():
    """transformers 5's masks call torch._C._log_api_usage_once inside Dynamo's graph."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                   max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                                   pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg), (torch.randint(0, 128, (2, 8)),)


MODELS = {"gpt2": _gpt2, "resnet": _resnet}


# ------------------------------------------------------------------ registration
def test_pyproject_entry_point_resolves_to_the_backend():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    value = meta["project"]["entry-points"]["torch_dynamo_backends"]["kiln"]
    module, attr = value.split(":")
    assert getattr(importlib.import_module(module), attr) is kiln.interop.backend


@pytest.mark.skipif(not _entry_point_installed(), reason="entry point not in the installed metadata")
def test_string_kiln_is_a_registered_dynamo_backend():
    from torch._dynamo.backends.registry import list_backends, lookup_backend
    assert "kiln" in list_backends(exclude_tags=())
    assert lookup_backend("kiln") is kiln.interop.backend


# ------------------------------------------------------------------ models
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_inference_matches_eager(name, backend):
    model, args = MODELS[name]()
    model.eval()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):  # the second call runs the compiled graph again (no recompile)
            expected = tensors_of(model(*args))
            actual = tensors_of(compiled(*args))
            assert len(actual) == len(expected) > 0
            for a, e in zip(actual, expected):
                torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    _assert_compiled_by_kiln(graphs=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(MODELS) + ["llama"])
def test_model_training_step_matches_eager(name, backend):
    """One training step: the loss, every parameter's gradient and (ResNet's batch norms) every
    buffer after the step equal eager's; the backward is kiln's (its kernels)."""
    model, args = {**MODELS, "llama": _llama}[name]()
    model.train()
    reference = copy.deepcopy(model)

    def step(m, *a):
        return loss_of(m(*a))
    expected = step(reference, *args)
    expected.backward()
    compiled = torch.compile(step, backend=backend)
    actual = compiled(model, *args)
    assert "KilnFunctionBackward" in _grad_fn_names(actual)  # kiln's autograd, not aot_autograd
    kernels_after_forward = kiln.stats()["kernels_generated"]
    actual.backward()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    checked = 0
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if q.grad is not None:
            scale = max(1.0, q.grad.abs().max().item())
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5 * scale, msg=n)
            checked += 1
    assert checked > 0
    for (n, b), c in zip(model.named_buffers(), reference.buffers()):
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-6, msg=n)
    stats = _assert_compiled_by_kiln(graphs=1)
    assert stats["kernels_generated"] > kernels_after_forward  # the backward's kernels


def _grad_fn_names(t) -> set:
    seen, todo = set(), [t.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or type(fn).__name__ in seen:
            continue
        seen.add(type(fn).__name__)
        todo.extend(f for f, _ in fn.next_functions)
    return seen


def test_gpt2_dynamic_sequence_length_one_kiln_graph():
    """dynamic=True on GPT-2: Dynamo passes sizes as SymInts (``torch.Size([s0, s1, 96])``)
    and module floats (eps, dropout p) as unspecialized tensors read with ``.item()``; kiln
    keeps every size symbolic, so three sequence lengths share one compiled graph."""
    model, _ = _gpt2()
    model.eval()
    compiled = torch.compile(model, backend=BACKEND, dynamic=True)
    with torch.no_grad():
        for length in (8, 12, 5):
            ids = torch.randint(0, 128, (2, length))
            for a, e in zip(tensors_of(compiled(ids)), tensors_of(model(ids))):
                torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    stats = _assert_compiled_by_kiln(graphs=1)
    assert stats["recompiles"] == 0


# ------------------------------------------------------------------ Dynamo's graph shapes
def _check(fn, *args, backend=BACKEND, **compile_kw):
    """Compiled result (and inputs after the call) equal eager's; returns the compiled fn."""
    compiled = torch.compile(fn, backend=backend, **compile_kw)
    mine = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    theirs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    actual, expected = compiled(*mine), fn(*theirs)
    torch.testing.assert_close(actual, expected)
    for a, e in zip(mine, theirs):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, e)
    return compiled


def _breaks(x):
    y = torch.sin(x) * 2
    torch._dynamo.graph_break()
    return torch.cos(y) + 1


def test_graph_break_under_dynamo_gives_two_kiln_graphs():
    explained = torch._dynamo.explain(_breaks)(torch.randn(8))
    assert explained.graph_break_count == 1
    torch._dynamo.reset()
    _check(_breaks, torch.randn(8))
    _assert_compiled_by_kiln(graphs=2)


def _sized(x, y):
    n = x.shape[0]
    return (x * 2).view(n, -1).relu() + y.sum(), n * 2


def test_dynamic_shapes_take_symint_placeholders():
    """dynamic=True: Dynamo passes the sizes as SymInt placeholders; kiln compiles one graph
    with the same symbols (no kiln recompile for new sizes, a returned size is per call)."""
    compiled = torch.compile(_sized, backend=BACKEND, dynamic=True)
    for rows in (4, 6, 9):
        x, y = torch.randn(rows, 3), torch.randn(3)
        actual, expected = compiled(x, y), _sized(x, y)
        torch.testing.assert_close(actual[0], expected[0])
        assert actual[1] == expected[1] == rows * 2
    stats = _assert_compiled_by_kiln(graphs=1)
    assert stats["recompiles"] == 0


def _sym_only(x, n):
    return x * n + n


def test_dynamic_int_argument_reaches_the_graph():
    """A Python int Dynamo made a SymInt with no tensor of its size: passed to kiln's graph
    through a carrier input, so one kiln graph serves every value."""
    compiled = torch.compile(_sym_only, backend=BACKEND, dynamic=True)
    x = torch.randn(5)
    for n in (3, 7, 11):
        torch.testing.assert_close(compiled(x, n), _sym_only(x, n))
    _assert_compiled_by_kiln(graphs=1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    def f(x, y):
        return torch.softmax(x @ y, -1) * 2 + x.float().mean()
    x, y = torch.randn(8, 8, dtype=dtype), torch.randn(8, 8, dtype=dtype)
    compiled = torch.compile(f, backend=BACKEND)
    actual, expected = compiled(x, y), f(x, y)
    assert actual.dtype == expected.dtype == dtype  # the 0-d float32 mean does not promote
    assert_close(actual, expected, dtype=dtype)
    _assert_compiled_by_kiln()


@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_non_contiguous_inputs(layout):
    base = torch.randn(8, 6)
    x = base.t() if layout == "transposed" else base[:, ::2]
    _check(lambda t: (t.exp() + 1).sum(0) * t[0], x)
    _assert_compiled_by_kiln()


def test_inplace_writes_to_inputs_are_written_back():
    def f(x, y):
        x.add_(1)
        z = y * 2
        z.mul_(3)
        return z + x
    _check(f, torch.randn(8), torch.randn(8))
    _assert_compiled_by_kiln()


def test_setitem_on_a_view_writes_through():
    def f(x, y):
        z = x * 2
        z[:, 1:3] = y  # operator.setitem in Dynamo's graph
        x[0] = 5.0      # and on an input: written back
        return z.sum(0)
    _check(f, torch.randn(4, 5), torch.randn(4, 2))
    _assert_compiled_by_kiln()


def test_no_grad_region_inside_the_graph():
    def f(x, w):
        with torch.no_grad():
            a = x * w
        return (a + x * w).sum()
    w = torch.randn(4, requires_grad=True)
    x = torch.randn(4)
    compiled = torch.compile(f, backend=BACKEND)
    out = compiled(x, w)
    out.backward()
    torch.testing.assert_close(w.grad, x)  # only the grad-enabled product is differentiated
    torch.testing.assert_close(out, f(x, w))
    _assert_compiled_by_kiln()


def test_autocast_region_inside_the_graph():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
        return y.float().sum(-1), y.dtype
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    compiled = torch.compile(f, backend=BACKEND)
    (actual, dtype), (expected, eager_dtype) = compiled(x, w), f(x, w)
    assert dtype == eager_dtype == torch.bfloat16
    torch.testing.assert_close(actual, expected)
    _assert_compiled_by_kiln()


def test_item_of_an_input_is_checked_per_call():
    """Dynamo passes a float it left unspecialized as a one-element tensor read with .item();
    kiln's ops want a number there, so it is a constant of the kiln graph, checked per call:
    another value compiles another variant, never a stale result."""
    gm = torch.fx.symbolic_trace(lambda x, s: torch.nn.functional.layer_norm(x, (4,), eps=s.item()) * 2)
    assert any(n.op == "call_method" and n.target == "item" for n in gm.graph.nodes)
    x = torch.randn(3, 4)
    compiled = kiln.interop.backend(gm, [x, torch.tensor(1e-5)])
    for eps in (1e-5, 0.5, 1e-5):
        s = torch.tensor(eps)
        torch.testing.assert_close(compiled(x, s), gm(x, s))
    stats = _assert_compiled_by_kiln(graphs=2)
    assert stats["recompiles"] == 1


def test_pad_in_training_is_a_kiln_op():
    """Dynamo records F.pad as the builtin torch._C._nn.pad (F.pad is a Python wrapper): the
    capture table maps both, so a gradient through it is kiln's (Swin, MobileNetV2 training)."""
    def f(x):
        return torch.nn.functional.pad(x.sin(), (1, 2, 0, 1), value=0.5).square().sum()
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out = torch.compile(f, backend=BACKEND)(x)
    out.backward()
    expected = f(x_ref)
    expected.backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, x_ref.grad)
    _assert_compiled_by_kiln()


# ------------------------------------------------------------------ GraphModules not from Dynamo
class _Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(4))
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.inner(x)) * self.scale


def test_symbolic_traced_module_with_call_module_and_get_attr():
    """call_module (inlined) and get_attr (a parameter read per call, with its gradient)."""
    mod = _Affine()
    gm = torch.fx.symbolic_trace(mod)
    assert {n.op for n in gm.graph.nodes} >= {"call_module", "get_attr"}
    x = torch.randn(3, 4)
    compiled = kiln.interop.backend(gm, [x])
    out = compiled(x)
    expected = mod(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    mine = [p.grad.clone() for p in mod.parameters()]
    mod.zero_grad()
    expected.sum().backward()
    for a, e in zip(mine, mod.parameters()):
        torch.testing.assert_close(a, e.grad)
    # no fake tensor described x: its sizes are checked per call, another size compiles again
    y = torch.randn(5, 4)
    torch.testing.assert_close(compiled(y), mod(y))
    stats = _assert_compiled_by_kiln(graphs=2)
    assert stats["recompiles"] == 1


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune-no-cudagraphs"])
def test_torch_compile_mode_reaches_the_backend(mode):
    seen = []

    def recording(gm, example_inputs, **kwargs):
        seen.append(kwargs)
        return BACKEND(gm, example_inputs, **kwargs)
    _check(lambda x: torch.tanh(x) * 3 - x, torch.randn(16), backend=recording, mode=mode)
    assert seen == [{"mode": mode}]
    _assert_compiled_by_kiln()


def test_unknown_options_key_is_an_error_naming_the_known_ones():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(ValueError, match="unknown options key 'no_such_key'.*max_autotune"):
        kiln.interop.backend(gm, [torch.randn(2)], options={"no_such_key": True})


# ------------------------------------------------------------------ no silent eager
def test_a_node_kiln_cannot_import_runs_the_graph_module_noted():
    def f(x):  # no core op, random, and a gradient is needed through it (a replayed
        return F.rrelu(x, training=True) + x.sum()  # backward would draw other numbers)
    x = torch.randn(3, 3, requires_grad=True)
    compiled = torch.compile(f, backend=BACKEND)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(0)
        out = compiled(x)
        compiled(x)
    torch.manual_seed(0)
    torch.testing.assert_close(out, f(x))  # the graph module ran eagerly: eager's draws
    stats = kiln.stats()
    assert stats["eager_runs"] == 2, stats
    messages = [str(w.message) for w in caught]
    assert sum("rrelu" in m for m in messages) == 1, messages  # warned once


def test_strict_raises_instead_of_running_eagerly(monkeypatch):
    from kiln.capture.errors import Unsupported
    x = torch.randn(3, 3, requires_grad=True)
    gm = torch.fx.symbolic_trace(lambda t: F.rrelu(t, training=True) * 2)
    with kiln.config.patch(strict=True):
        with pytest.raises(Unsupported, match="rrelu"):
            kiln.interop.backend(gm, [x])
