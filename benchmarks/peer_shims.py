"""The stand-ins benchmarks/peer_tests.py puts in PyTorch's test files while a case runs:
``check_model`` with kiln as the compiler under test (:func:`kiln_check_model`), Dynamo's
``standard_test``, and ``torch.compile`` / ``optimize`` / ``optimize_assert`` as ``kiln.compile``.
Each fills in the per-case record (``CASE``) that peer_tests classifies the case by."""
from __future__ import annotations

import collections

class NotKept(Exception):
    """The case exercises something other than kiln (Inductor internals, a missing helper)."""


class InductorMetric(Exception):
    """The case reads one of Inductor's own counters (kernels generated, IR nodes), which
    say nothing about kiln; the correctness checks before it still count."""


class MetricsStandIn:
    """torch._inductor.metrics while a case runs: writes are kept, reads end the case."""

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)

    def __getattribute__(self, name):
        if name.startswith("__") or name == "reset":
            return object.__getattribute__(self, name) if name != "reset" else (lambda: None)
        raise InductorMetric(f"reads torch._inductor.metrics.{name}")


class KilnFailure(Exception):
    """kiln raised where eager did not."""


# --- the per-case record kiln_check_model and the shims fill in ---------------------------

CASE = {}


def reset_case():
    CASE.clear()
    CASE.update(kiln_calls=0, fallbacks=0, eager_runs=0, breaks=0, stride_mismatch=0,
                 direct=False, matched=0)


def _refusal(message):
    """kiln's refusal under fullgraph=True (``GraphBreakError``) as the Dynamo ``Unsupported`` a
    case may expect (``assertRaisesRegex(torch._dynamo.exc.Unsupported, "Generator")``); still
    a KilnFailure for every case that does not expect one."""
    from torch._dynamo.exc import Unsupported

    class KilnRefusal(KilnFailure, Unsupported):
        def __init__(self, msg):
            Unsupported.__init__(self, msg)
    KilnRefusal.__name__ = KilnRefusal.__qualname__ = "KilnFailure"  # _classify reads the name
    return KilnRefusal(message)


def _eager_error(err, eager, args, kwargs):
    """kiln's exception as Dynamo spells an error eager raises in a traced op
    (``TorchRuntimeError``, which a case may expect) where ``eager`` on the same inputs raises
    the same exception; None where it does not (or the type cannot be combined)."""
    from torch._dynamo.exc import TorchRuntimeError
    try:
        eager(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the exception eager raises, compared below
        if type(e) is not type(err) or str(e) != str(err):
            return None
    else:
        return None
    # RuntimeError itself is a base of TorchRuntimeError: listed first, no MRO exists
    bases = ((TorchRuntimeError,) if issubclass(TorchRuntimeError, type(err))
             else (type(err), TorchRuntimeError))
    try:
        cls = type(f"Eager{type(err).__name__}", bases, {})
        out = cls(*err.args)
    except TypeError:
        return None
    return out


def _kiln_call(compiled, args, kwargs, eager=None):
    """Call kiln's compiled function; ``eager`` (the original function, for the cases that
    call ``torch.compile`` themselves) tells kiln's error apart from eager's own."""
    import kiln
    before = kiln.stats()
    try:
        out = compiled(*args, **kwargs)
    except kiln.GraphBreakError as e:
        raise _refusal(f"{type(e).__name__}: {e}") from e
    except Exception as e:  # noqa: BLE001
        same = _eager_error(e, eager, args, kwargs) if eager is not None else None
        if same is not None:  # eager raises it too: kiln gave the user eager's error
            _count_kiln_call(before)  # a call kiln ran (``assertRaises`` cases), not one it missed
            raise same from e
        raise KilnFailure(f"{type(e).__name__}: {e}") from e
    _count_kiln_call(before)
    return out


def _count_kiln_call(before):
    import kiln
    after = kiln.stats()
    CASE["kiln_calls"] += 1
    for key, stat in (("fallbacks", "fallbacks"), ("eager_runs", "eager_runs"),
                      ("breaks", "graph_breaks")):
        CASE[key] += after.get(stat, 0) - before.get(stat, 0)


def _clone_like(x):
    import torch
    if not isinstance(x, torch.Tensor):
        return x
    out = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
    with torch.no_grad():
        out.copy_(x)
    return out.requires_grad_(x.requires_grad) if x.is_leaf else out


def _upcast(x):
    import torch
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16):
        return x.float(), True
    return x, False


def kiln_check_model(self, model, example_inputs, kwargs=None, *, atol=None, rtol=None,
                     grad_atol=None, grad_rtol=None, check_lowp=True, exact_dtype=True,
                     nopython=True, copy_to_gpu=True, reference_in_float=True,
                     assert_equal=True, check_gradient=False, check_has_compiled=True,
                     output_process_fn_grad=lambda x: x, **_ignored):
    """check_model's contract, with kiln as the compiler under test."""
    import copy

    import torch
    from torch.utils import _pytree as pytree

    import kiln
    import torch._inductor.config as inductor_config
    if inductor_config.fallback_random:
        raise NotKept("asks for eager's RNG stream (Inductor's fallback_random); kiln draws "
                      "its own random numbers")
    kiln.reset()
    model = _direct_original(model)
    kwargs = kwargs or {}
    expect_dtypes = None
    if reference_in_float and exact_dtype:
        torch.manual_seed(0)
        try:
            plain = model(*[_clone_like(x) for x in example_inputs], **kwargs)
            expect_dtypes = [x.dtype if isinstance(x, torch.Tensor) else None
                             for x in pytree.tree_leaves(plain)]
        except RuntimeError:
            pass
    ref_inputs = [_clone_like(x) for x in example_inputs]
    ref_model, ref_kwargs = model, dict(kwargs)
    if reference_in_float:
        pairs = [_upcast(x) for x in ref_inputs]
        ref_inputs = [p[0] for p in pairs]
        lowp = any(p[1] for p in pairs)
        ref_kwargs = {k: _upcast(v)[0] for k, v in kwargs.items()}
        if lowp and hasattr(model, "to"):
            ref_model = copy.deepcopy(model).to(torch.float)
    torch.manual_seed(0)
    correct = ref_model(*ref_inputs, **ref_kwargs)

    compiled = kiln.compile(model, fullgraph=nopython)
    torch.manual_seed(0)
    actual = _kiln_call(compiled, example_inputs, kwargs)
    if check_has_compiled and kiln.stats().get("frames_compiled", 0) == 0:
        raise AssertionError("kiln compiled no frame")
    assert type(actual) is type(correct), (type(actual), type(correct))
    actual_flat = pytree.tree_leaves(actual)
    correct_flat, spec = pytree.tree_flatten(correct)
    assert len(actual_flat) == len(correct_flat)
    if expect_dtypes is not None:
        for want, got in zip(expect_dtypes, actual_flat):
            if want is not None:
                assert got.dtype == want, f"dtype mismatch: expected {want}, got {got.dtype}"
    if reference_in_float:
        correct_flat = [y.to(x.dtype) if isinstance(y, torch.Tensor) and y.dtype.is_floating_point
                        and isinstance(x, torch.Tensor) else y
                        for x, y in zip(actual_flat, correct_flat)]
        correct = pytree.tree_unflatten(correct_flat, spec)
    for x, y in zip(actual_flat, correct_flat):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dim() == y.dim():
            significant = [d for d in range(x.dim()) if x.size(d) > 1]
            if any(x.stride(d) != y.stride(d) for d in significant):
                CASE["stride_mismatch"] += 1
    if assert_equal:
        assert_same(actual, correct, atol, rtol, exact_dtype)
        assert_same(list(example_inputs), ref_inputs, atol, rtol, False)  # input mutations
    if check_gradient:
        _check_gradients(self, output_process_fn_grad(actual), output_process_fn_grad(correct),
                         example_inputs, ref_inputs, grad_atol or atol, grad_rtol or rtol)
    CASE["matched"] += assert_equal  # eager ran these inputs, and kiln's results equal its


def assert_same(actual, expected, atol, rtol, exact_dtype):
    """Values (NaN equal to NaN), structure and, with exact_dtype, dtypes; the test case's own
    tolerances, else torch's defaults for the dtype."""
    import torch
    from torch.utils import _pytree as pytree
    got, got_spec = pytree.tree_flatten(actual)
    want, want_spec = pytree.tree_flatten(expected)
    assert len(got) == len(want), f"{len(got)} outputs, eager has {len(want)}"
    if atol is None or rtol is None:
        atol = rtol = None
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor) or isinstance(g, torch.Tensor):
            assert isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor), (g, w)
            if not exact_dtype and g.dtype != w.dtype:
                w = w.to(g.dtype)
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True,
                                       check_dtype=exact_dtype, check_stride=False)
        elif isinstance(w, float) and isinstance(g, float) and w != w:
            assert g != g, (g, w)
        elif type(w).__module__ == "numpy" and hasattr(w, "shape"):  # an ndarray or numpy scalar
            import numpy as np
            assert type(g) is type(w), (type(g), type(w))
            np.testing.assert_allclose(g, w, rtol=rtol or 1.3e-6, atol=atol or 1e-5, equal_nan=True)
        elif isinstance(w, dict) and type(w) not in (dict, collections.OrderedDict):
            # a dict subclass pytree keeps whole (test_functions' CustomDictSubclass)
            assert type(g) is type(w) and list(g) == list(w), (g, w)
            assert_same(list(g.values()), list(w.values()), atol, rtol, exact_dtype)
        else:
            assert g == w, (g, w)


def _check_gradients(self, actual, correct, inputs, ref_inputs, atol, rtol):
    import torch
    from torch.utils import _pytree as pytree
    outs = [r for r in pytree.tree_leaves(correct)
            if isinstance(r, torch.Tensor) and r.requires_grad]
    mine = [r for r in pytree.tree_leaves(actual)
            if isinstance(r, torch.Tensor) and r.requires_grad]
    if not outs:
        return
    assert len(mine) == len(outs), "compiled outputs lost requires_grad"
    grads = [torch.rand_like(r) for r in outs]
    leaves = [x for x in ref_inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    my_leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    want = torch.autograd.grad(outs, leaves, grads, allow_unused=True)
    got = torch.autograd.grad(mine, my_leaves, [g.to(m.dtype) for g, m in zip(grads, mine)],
                              allow_unused=True)
    want = [w.to(g.dtype) if w is not None and g is not None else w for w, g in zip(want, got)]
    assert_same(list(got), list(want), atol, rtol, False)


def kiln_standard_test(self, fn, nargs, expected_ops=None, expected_ops_dynamic=None,
                       expected_frame_count=1):
    """torch._dynamo.testing.standard_test with kiln: two input sets, each twice."""
    import torch

    import kiln
    args1 = [torch.randn(10, 10) for _ in range(nargs)]
    args2 = [torch.randn(10, 10) for _ in range(nargs)]
    correct1, correct2 = fn(*args1), fn(*args2)
    kiln.reset()
    compiled = kiln.compile(fn)
    got = [_kiln_call(compiled, a, {}) for a in (args1, args2, args1, args2)]
    for value, want in zip(got, (correct1, correct2, correct1, correct2)):
        assert_same(value, want, None, None, True)


def forbid(what):
    def refuse(*args, **kwargs):
        raise NotKept(f"calls {what}: it tests Inductor itself")
    return refuse


class _CountedModule:
    """Mixed into kiln's compiled module for a case's own ``torch.compile(module)``: calls go
    through :func:`_kiln_call` (counted, kiln's errors told apart from eager's), while the
    module stays a module (``parameters()``, ``state_dict()``, attribute writes)."""

    def __call__(self, *args, **kwargs):
        plain = super().__call__
        return _kiln_call(lambda *a, **k: plain(*a, **k), args, kwargs, eager=self._orig_mod)


def kiln_in_place_of_torch_compile(model=None, *, fullgraph=False, dynamic=None, backend=None,
                                    mode=None, options=None, disable=False, **ignored):
    import torch

    import kiln
    CASE["direct"] = True
    if disable:
        return model if model is not None else (lambda f: f)

    # a case that raises Dynamo's recompile limit (``@torch._dynamo.config.patch(
    # recompile_limit=10)``) gives kiln the same: how many variants to compile is no answer
    limit = max(torch._dynamo.config.recompile_limit, kiln.config.recompile_limit)

    def wrap(fn):
        compiled = kiln.compile(fn, fullgraph=fullgraph, dynamic=dynamic, recompile_limit=limit)
        if isinstance(compiled, torch.nn.Module):
            cls = type(compiled)
            compiled.__class__ = type(cls.__name__, (_CountedModule, cls), {})
            return compiled

        def call(*args, **kwargs):
            return _kiln_call(compiled, args, kwargs, eager=fn)
        call.__wrapped__ = fn
        call._peer_original = fn
        return call
    return wrap(model) if model is not None else wrap


def kiln_forgets_on_dynamo_reset(dynamo_reset):
    """Dynamo's code-cache reset as a case calls it between variants it wants compiled afresh
    (``torch._dynamo.reset_code_caches()``, test_resize): kiln forgets its compiled entries
    too, or the variants pile up past the recompile limit, which under ``fullgraph=True`` is an
    error Dynamo never meets there."""
    def reset(*args, **kwargs):
        import kiln
        out = dynamo_reset(*args, **kwargs)
        kiln.reset()
        return out
    return reset


def _direct_original(model):
    """The eager function or module behind a case's own ``torch.compile`` (``self.common(
    torch.compile(fn), ...)``): the reference must run eagerly, and kiln compiles it once."""
    if isinstance(model, _CountedModule):
        return model._orig_mod
    return getattr(model, "_peer_original", model)


def eager_in_place_of_compile(model=None, *args, **kwargs):
    """``--eager-compile``: a case's own compile returns the function itself (``torch.compile``,
    ``optimize(backend)`` and ``optimize_assert(backend)`` alike). A direct case that fails so
    as well asserts something of Inductor, not of the answers."""
    CASE["direct"] = True
    return model if callable(model) else (lambda f: f)


def kiln_in_place_of_optimize(backend=None, *, nopython=False, dynamic=None, disable=False,
                               **ignored):
    """``torch._dynamo.optimize(backend)(fn)``: kiln, one graph required where ``nopython``
    (backend and guard callbacks ignored)."""
    return kiln_in_place_of_torch_compile(fullgraph=nopython, dynamic=dynamic, disable=disable)


def kiln_in_place_of_optimize_assert(backend=None, *, dynamic=None, **ignored):
    """``torch._dynamo.optimize_assert(backend)(fn)``, Dynamo's one-graph-or-raise mode: kiln
    with ``fullgraph=True`` (backend, hooks and export arguments ignored)."""
    return kiln_in_place_of_torch_compile(fullgraph=True, dynamic=dynamic)
