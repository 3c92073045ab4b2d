"""PyTorch's own compiler tests, run against kiln: the peer figures of issue 24.

Two of PyTorch's test files are read from paths given on the command line (they stay out of
this repository):

- ``test/dynamo/test_functions.py``: each ``make_test`` case goes through
  ``torch._dynamo.testing.standard_test``, which this harness replaces with one that compiles
  the function with ``kiln.compile`` (two input sets, each called twice, compared with eager).
  Cases that call ``torch.compile`` themselves get ``kiln.compile`` in its place (``backend``
  ignored, ``fullgraph`` kept), and ``torch._dynamo.optimize_assert(backend)`` gets
  ``kiln.compile(fullgraph=True)``; their counters are Dynamo's, so they are reported apart
  (``direct_*``).
- ``test/inductor/test_torchinductor.py``: the ``CommonTemplate`` cases are copied onto a CPU
  test class whose ``common`` is :func:`kiln_check_model`, kiln's version of the file's
  ``check_model`` (eager reference, upcast to fp32 for fp16/bf16 inputs, output types and
  dtypes, values, input mutations, gradients where asked). A case that reaches Inductor on its
  own (``torch.compile``, ``optimize_assert``, ``run_and_get_code``, ...) is *not kept*: it
  tests Inductor itself.

A case passes only when its results match eager and kiln compiled it: a case that fell back to
eager, or ran a frame eagerly, is ``fallback``, not ``pass``. kiln's refusal under
``fullgraph=True`` (``GraphBreakError``) is raised as Dynamo's ``Unsupported`` too, so a case
asserting that the compiler refuses (a ``torch.Generator`` argument) sees it; anywhere else it
is a ``kiln_error``. Where kiln raises the exception eager raises on the same inputs (a case
calling ``torch.compile`` itself), it is raised as Dynamo's ``TorchRuntimeError`` as well,
which such a case expects. A case that asserts an error eager does not raise (Inductor's own
divergence), after kiln matched eager on those inputs, is not kept.

Each case runs in a child process that survives nothing but the case: a crash (SIGFPE, a
segfault) is recorded against the case that was running, and the next child resumes after it.

    python -m benchmarks.peer_tests --inductor PATH/test_torchinductor.py \
        --functions PATH/test_functions.py --out peer.jsonl [-k PATTERN] [--jobs 2]

The summary (counts per status and file) goes to stderr, one JSON line per case to ``--out``.
"""
from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import signal
import subprocess
import sys
import time
import unittest

STATUSES = ("pass", "mismatch", "kiln_error", "fallback", "crash", "timeout", "not_kept",
            "skipped", "error")


class NotKept(Exception):
    """The case exercises something other than kiln (Inductor internals, a missing helper)."""


class InductorMetric(Exception):
    """The case reads one of Inductor's own counters (kernels generated, IR nodes), which
    say nothing about kiln; the correctness checks before it still count."""


class _MetricsStandIn:
    """torch._inductor.metrics while a case runs: writes are kept, reads end the case."""

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)

    def __getattribute__(self, name):
        if name.startswith("__") or name == "reset":
            return object.__getattribute__(self, name) if name != "reset" else (lambda: None)
        raise InductorMetric(f"reads torch._inductor.metrics.{name}")


class KilnFailure(Exception):
    """kiln raised where eager did not."""


class _Missing:
    """A name the test file imports that this torch does not have. As a decorator it passes
    the function through; any other use marks the case as not kept."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Missing(f"{self._name}(...)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise NotKept(f"uses {self._name}.{attr}, which this torch lacks")

    def __bool__(self):
        return False


def _guarded_module_source(path):
    """The test file with every top-level statement other than a def or class wrapped in
    try/except, and failed imports bound to placeholders: the file targets another torch
    build (imports of Inductor internals move between releases)."""
    tree = ast.parse(open(path).read(), filename=path)
    body = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body.append(node)
            continue
        fallback = [ast.Pass()]
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.asname or a.name.split(".")[0] for a in node.names if a.name != "*"]
            fallback = [ast.parse(f"{n} = _Missing({n!r})").body[0] for n in names] or fallback
        body.append(ast.Try(body=[node], handlers=[ast.ExceptHandler(
            type=ast.Name("BaseException", ast.Load()), name=None, body=fallback)],
            orelse=[], finalbody=[]))
    tree.body = body
    ast.fix_missing_locations(tree)
    return compile(tree, path, "exec")


def load_test_module(path, name):
    import types
    module = types.ModuleType(name)
    module.__file__ = path
    module._Missing = _Missing
    sys.modules[name] = module
    exec(_guarded_module_source(path), module.__dict__)
    return module


# --- the per-case record kiln_check_model and the shims fill in ---------------------------

_CASE = {}


def _reset_case():
    _CASE.clear()
    _CASE.update(kiln_calls=0, fallbacks=0, eager_runs=0, breaks=0, stride_mismatch=0,
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
    _CASE["kiln_calls"] += 1
    for key, stat in (("fallbacks", "fallbacks"), ("eager_runs", "eager_runs"),
                      ("breaks", "graph_breaks")):
        _CASE[key] += after.get(stat, 0) - before.get(stat, 0)


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
                _CASE["stride_mismatch"] += 1
    if assert_equal:
        assert_same(actual, correct, atol, rtol, exact_dtype)
        assert_same(list(example_inputs), ref_inputs, atol, rtol, False)  # input mutations
    if check_gradient:
        _check_gradients(self, output_process_fn_grad(actual), output_process_fn_grad(correct),
                         example_inputs, ref_inputs, grad_atol or atol, grad_rtol or rtol)
    _CASE["matched"] += assert_equal  # eager ran these inputs, and kiln's results equal its


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


def _forbid(what):
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


def _kiln_in_place_of_torch_compile(model=None, *, fullgraph=False, dynamic=None, backend=None,
                                    mode=None, options=None, disable=False, **ignored):
    import torch

    import kiln
    _CASE["direct"] = True
    if disable:
        return model if model is not None else (lambda f: f)

    def wrap(fn):
        compiled = kiln.compile(fn, fullgraph=fullgraph, dynamic=dynamic)
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


def _direct_original(model):
    """The eager function or module behind a case's own ``torch.compile`` (``self.common(
    torch.compile(fn), ...)``): the reference must run eagerly, and kiln compiles it once."""
    if isinstance(model, _CountedModule):
        return model._orig_mod
    return getattr(model, "_peer_original", model)


def _eager_in_place_of_compile(model=None, *args, **kwargs):
    """``--eager-compile``: a case's own compile returns the function itself (``torch.compile``,
    ``optimize(backend)`` and ``optimize_assert(backend)`` alike). A direct case that fails so
    as well asserts something of Inductor, not of the answers."""
    _CASE["direct"] = True
    return model if callable(model) else (lambda f: f)


def _kiln_in_place_of_optimize(backend=None, *, nopython=False, dynamic=None, disable=False,
                               **ignored):
    """``torch._dynamo.optimize(backend)(fn)``: kiln, one graph required where ``nopython``
    (backend and guard callbacks ignored)."""
    return _kiln_in_place_of_torch_compile(fullgraph=nopython, dynamic=dynamic, disable=disable)


def _kiln_in_place_of_optimize_assert(backend=None, *, dynamic=None, **ignored):
    """``torch._dynamo.optimize_assert(backend)(fn)``, Dynamo's one-graph-or-raise mode: kiln
    with ``fullgraph=True`` (backend, hooks and export arguments ignored)."""
    return _kiln_in_place_of_torch_compile(fullgraph=True, dynamic=dynamic)


# --- collecting and running cases ---------------------------------------------------------

def _inductor_cases(path):
    import torch
    import torch._inductor.metrics  # noqa: F401 - replaced by a stand-in while a case runs
    module = load_test_module(path, "peer_test_torchinductor")
    base = getattr(module, "TestCase", unittest.TestCase)

    class KilnCpuTests(base):
        common = kiln_check_model
        device = "cpu"
    module.copy_tests(module.CommonTemplate, KilnCpuTests, "cpu")
    for name in ("run_and_get_code", "run_and_get_triton_code", "run_and_get_cpp_code",
                 "run_fw_bw_and_get_code", "compile_fx", "compile_fx_inner"):
        if hasattr(module, name):
            setattr(module, name, _forbid(name))
    # Inductor's kernel count is no statement about kiln: the check passes over it
    module.assertGeneratedKernelCountEqual = lambda self, expected: None
    # a case's own compile is kiln's too: most compare with eager, which is kiln's contract;
    # their other checks may read Inductor's state, so they are reported apart (direct_*)
    patches = {(torch, "compile"): _kiln_in_place_of_torch_compile,
               (torch._dynamo, "optimize"): _kiln_in_place_of_optimize,
               (torch._dynamo, "optimize_assert"): _kiln_in_place_of_optimize_assert,
               (torch._inductor, "metrics"): _MetricsStandIn()}
    names = sorted(n for n in dir(KilnCpuTests) if n.startswith("test_"))
    return KilnCpuTests, names, patches


def _functions_cases(path):
    import torch
    import torch._dynamo.testing
    torch._dynamo.testing.standard_test = kiln_standard_test
    module = load_test_module(path, "peer_test_functions")
    classes = [getattr(module, c) for c in dir(module)
               if isinstance(getattr(module, c), type)
               and issubclass(getattr(module, c), unittest.TestCase)
               and getattr(module, c).__module__ == "peer_test_functions"]
    patches = {(torch, "compile"): _kiln_in_place_of_torch_compile,
               (torch._dynamo, "optimize_assert"): _kiln_in_place_of_optimize_assert,
               (torch._dynamo, "optimize"): _forbid("torch._dynamo.optimize")}
    return classes, patches


def collect(args):
    """[(file, class, test name)] in a fixed order."""
    cases = []
    if args.inductor:
        cls, names, _ = _inductor_cases(args.inductor)
        cases += [("inductor", cls.__name__, n) for n in names]
    if args.functions:
        classes, _ = _functions_cases(args.functions)
        for cls in classes:
            cases += [("functions", cls.__name__, n) for n in sorted(dir(cls))
                      if n.startswith("test_")]
    if args.k:  # a substring, or several separated by '|'
        cases = [c for c in cases if any(k in c[2] for k in args.k.split("|"))]
    return cases


class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def _exception_line(err):
    """The exception's own line of a formatted traceback (PyTorch appends hints after it)."""
    lines = [ln for ln in err.strip().splitlines() if ln and not ln[0].isspace()
             and not ln.startswith(("Traceback", "During handling", "The above", "To execute",
                                    "This message"))]
    return (lines[-1] if lines else err.strip().splitlines()[-1])[:400]


def _classify(result, test):
    problems = [(kind, err) for kind, lst in (("failure", result.failures), ("error", result.errors))
                for t, err in lst if t is test]
    if result.skipped:
        return "skipped", result.skipped[0][1][:300]
    if problems:
        kind, err = problems[0]
        last = _exception_line(err)
        if "NotKept" in err:
            return "not_kept", last
        if "InductorMetric" in err and _CASE["kiln_calls"] and not (
                _CASE["fallbacks"] or _CASE["eager_runs"]):
            return "pass", f"checked; then {last}"
        if "_Timeout" in err:
            return "timeout", last
        if "KilnFailure" in err:
            return "kiln_error", last
        if _CASE["fallbacks"] or _CASE["eager_runs"]:
            return "fallback", last
        if kind == "failure" and " not raised" in last and _CASE["matched"]:
            # ``with self.assertRaises(...): self.common(...)``: Inductor raises where eager
            # gives an answer (test_cat_unbacked_legacy_empty), and kiln gave eager's
            return "not_kept", f"expects an error eager does not raise, and kiln matched eager ({last})"
        if kind == "failure":
            return "mismatch", last
        return "error", last
    if result.expectedFailures:
        return "not_kept", "expected failure in PyTorch's own file"
    if not _CASE["kiln_calls"]:
        return "not_kept", "kiln never ran"
    if _CASE["fallbacks"] or _CASE["eager_runs"]:
        return "fallback", f"fallbacks={_CASE['fallbacks']} eager_runs={_CASE['eager_runs']}"
    return "pass", ""


def run_child(args):
    """Run the cases from --start on (every --stride-th), one JSON line each, flushed."""
    import warnings
    warnings.simplefilter("ignore")
    cases = collect(args)
    inductor = _inductor_cases(args.inductor) if args.inductor else None
    functions = _functions_cases(args.functions) if args.functions else None
    if args.eager_compile:
        for patches in [p for p in (inductor, functions) if p]:
            for key in [k for k in patches[-1] if k[1] in ("compile", "optimize", "optimize_assert")]:
                patches[-1][key] = _eager_in_place_of_compile
    out = open(args.child_out, "a")
    signal.signal(signal.SIGALRM, _on_alarm)
    for index in range(args.start, len(cases), args.stride):
        file, clsname, name = cases[index]
        if file == "inductor":
            cls, _, patches = inductor
        else:
            classes, patches = functions
            cls = next(c for c in classes if c.__name__ == clsname)
        print(json.dumps({"index": index, "begin": True}), file=out, flush=True)
        _reset_case()
        if "aoti" in name:  # AOTInductor's own eager mode and packaging, not a compiler test
            print(json.dumps({"index": index, "file": file, "case": f"{clsname}.{name}",
                              "status": "not_kept", "detail": "tests AOTInductor"}),
                  file=out, flush=True)
            continue
        saved = {key: getattr(*key) for key in patches}
        for (owner, attr), value in patches.items():
            setattr(owner, attr, value)
        test = cls(name)
        result = unittest.TestResult()
        started = time.perf_counter()
        signal.alarm(args.timeout)
        try:
            test.run(result)
        finally:
            signal.alarm(0)
            for (owner, attr), value in saved.items():
                setattr(owner, attr, value)
        status, detail = _classify(result, test)
        if _CASE["direct"] and status in ("pass", "mismatch", "error"):
            status = "direct_" + status
        row = {"index": index, "file": file, "case": f"{clsname}.{name}", "status": status,
               "detail": detail, "seconds": round(time.perf_counter() - started, 2),
               **{k: _CASE[k] for k in ("kiln_calls", "fallbacks", "eager_runs", "breaks",
                                        "stride_mismatch")}}
        print(json.dumps(row), file=out, flush=True)
    out.close()


def _drive(args, total):
    """Children per stride lane, restarted after a crash from the next case."""
    rows = {}
    lanes = []
    for lane in range(args.jobs):
        path = f"{args.out}.lane{lane}"
        if os.path.exists(path):
            os.remove(path)
        lanes.append({"lane": lane, "next": lane, "path": path, "proc": None})
    base = [sys.executable, "-m", "benchmarks.peer_tests", "--timeout", str(args.timeout),
            "--stride", str(args.jobs)]
    for flag in ("inductor", "functions", "k"):
        if getattr(args, flag):
            base += [f"--{flag}" if flag != "k" else "-k", getattr(args, flag)]
    base += ["--eager-compile"] if args.eager_compile else []
    while True:
        for lane in lanes:
            if lane["proc"] is None and lane["next"] < total:
                lane["proc"] = subprocess.Popen(
                    base + ["--child-out", lane["path"], "--start", str(lane["next"])],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    env={**os.environ, "PYTORCH_PRINT_REPRO_ON_FAILURE": "0"})
        running = [lane for lane in lanes if lane["proc"] is not None]
        if not running:
            break
        time.sleep(0.5)
        for lane in running:
            code = lane["proc"].poll()
            if code is None:
                continue
            lane["proc"] = None
            began, last = None, lane["next"] - args.jobs
            for line in open(lane["path"]):
                rec = json.loads(line)
                if rec.get("begin"):
                    began = rec["index"]
                else:
                    rows[rec["index"]] = rec
                    last = max(last, rec["index"])
                    began = None if began == rec["index"] else began
            if began is not None and began not in rows:
                rows[began] = {"index": began, "status": "crash",
                               "detail": f"child exited with {code}"}
                last = max(last, began)
            lane["next"] = last + args.jobs
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inductor", help="path to PyTorch's test/inductor/test_torchinductor.py")
    parser.add_argument("--functions", help="path to PyTorch's test/dynamo/test_functions.py")
    parser.add_argument("--out", default="peer_tests.jsonl")
    parser.add_argument("-k", help="only cases whose name contains this")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=120, help="seconds per case")
    parser.add_argument("--eager-compile", action="store_true",
                        help="a case's own torch.compile returns the function itself (triage: a "
                             "direct case failing so tests Inductor, not the answers)")
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stride", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not (args.inductor or args.functions):
        parser.error("give --inductor and/or --functions")
    if args.child_out:
        return run_child(args)
    cases = collect(args)
    rows = _drive(args, len(cases))
    counts = collections.Counter()
    with open(args.out, "w") as f:
        for index, (file, clsname, name) in enumerate(cases):
            row = rows.get(index, {"status": "crash", "detail": "no record"})
            row.update(index=index, file=file, case=f"{clsname}.{name}")
            counts[(file, row["status"])] += 1
            f.write(json.dumps(row) + "\n")
    for file in sorted({c[0] for c in cases}):
        summary = ", ".join(f"{status} {n}" for (f2, status), n in sorted(counts.items())
                            if f2 == file)
        print(f"{file}: {summary}", file=sys.stderr)
    for lane in range(args.jobs):
        path = f"{args.out}.lane{lane}"
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
