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
  dtypes, values, input mutations, gradients where asked). A case that calls ``torch.compile``,
  ``torch._dynamo.optimize`` or ``optimize_assert`` itself gets ``kiln.compile`` in its place, as
  in the functions file (``direct_*``: its checks may read Inductor's state). A direct case that
  fails is run again with its own compile as the identity: failing there the same way (same
  line, same message), it asserts Inductor's behaviour (Dynamo's compile counters, Inductor's
  profiler names, an error eager does not raise) and is *not kept*; ``--eager-compile`` runs
  every case so, for triage. A case that reaches Inductor's internals (``run_and_get_code``,
  ``compile_fx_inner``, AOTInductor) is not kept: it tests Inductor itself.

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
        --functions PATH/test_functions.py --out peer.jsonl [-k PATTERN] [--jobs 2] [--eager-compile]

The stand-ins that run in the test files' place are in ``benchmarks/peer_shims.py``.

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

from benchmarks.peer_shims import (CASE, MetricsStandIn, NotKept, eager_in_place_of_compile, forbid,
                                   kiln_check_model, kiln_forgets_on_dynamo_reset,
                                   kiln_in_place_of_optimize,
                                   kiln_in_place_of_optimize_assert, kiln_in_place_of_torch_compile,
                                   kiln_standard_test, reset_case)

STATUSES = ("pass", "mismatch", "kiln_error", "fallback", "crash", "timeout", "not_kept",
            "skipped", "error")


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
            setattr(module, name, forbid(name))
    # Inductor's kernel count is no statement about kiln: the check passes over it
    module.assertGeneratedKernelCountEqual = lambda self, expected: None
    # a case's own compile is kiln's too: most compare with eager, which is kiln's contract;
    # their other checks may read Inductor's state, so they are reported apart (direct_*)
    patches = {(torch, "compile"): kiln_in_place_of_torch_compile,
               (torch._dynamo, "optimize"): kiln_in_place_of_optimize,
               (torch._dynamo, "optimize_assert"): kiln_in_place_of_optimize_assert,
               (torch._dynamo, "reset_code_caches"):
                   kiln_forgets_on_dynamo_reset(torch._dynamo.reset_code_caches),
               (torch._inductor, "metrics"): MetricsStandIn()}
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
    patches = {(torch, "compile"): kiln_in_place_of_torch_compile,
               (torch._dynamo, "optimize_assert"): kiln_in_place_of_optimize_assert,
               (torch._dynamo, "optimize"): forbid("torch._dynamo.optimize")}
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
    line = lines[-1] if lines else err.strip().splitlines()[-1]
    return line.replace("benchmarks.peer_shims.", "")[:400]  # NotKept, KilnFailure: short names


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
        if "InductorMetric" in err and CASE["kiln_calls"] and not (
                CASE["fallbacks"] or CASE["eager_runs"]):
            return "pass", f"checked; then {last}"
        if "InductorMetric" in err and not CASE["kiln_calls"]:
            return "not_kept", f"nothing of kiln's checked before: {last}"
        if "_Timeout" in err:
            return "timeout", last
        if "KilnFailure" in err:
            return "kiln_error", last
        if CASE["fallbacks"] or CASE["eager_runs"]:
            return "fallback", last
        if kind == "failure" and " not raised" in last and CASE["matched"]:
            # ``with self.assertRaises(...): self.common(...)``: Inductor raises where eager
            # gives an answer (test_cat_unbacked_legacy_empty), and kiln gave eager's
            return "not_kept", f"expects an error eager does not raise, and kiln matched eager ({last})"
        if kind == "failure":
            return "mismatch", last
        return "error", last
    if result.expectedFailures:
        return "not_kept", "expected failure in PyTorch's own file"
    if not CASE["kiln_calls"]:
        return "not_kept", "kiln never ran: the case compiles nothing (eager-only checks, Inductor utilities)"
    if CASE["fallbacks"] or CASE["eager_runs"]:
        return "fallback", f"fallbacks={CASE['fallbacks']} eager_runs={CASE['eager_runs']}"
    return "pass", ""


_COMPILE_ENTRIES = ("compile", "optimize", "optimize_assert")


def _as_eager(patches):
    """The patches with a case's own compile as the identity (``--eager-compile``)."""
    return {key: eager_in_place_of_compile if key[1] in _COMPILE_ENTRIES else value
            for key, value in patches.items()}


def _run_case(cls, name, patches, timeout):
    """One run of a case with ``patches`` in place: (test, unittest result)."""
    saved = {key: getattr(*key) for key in patches}
    for (owner, attr), value in patches.items():
        setattr(owner, attr, value)
    test = cls(name)
    result = unittest.TestResult()
    signal.alarm(timeout)
    try:
        test.run(result)
    finally:
        signal.alarm(0)
        for (owner, attr), value in saved.items():
            setattr(owner, attr, value)
    return test, result


def _failure_signature(result, test):
    """Where in the case (its last frame in a ``test_*`` function of the test file) and with
    what message a run failed, the exception's type aside (kiln raises eager's error as a
    Dynamo-spelled subclass of it); None where the run passed."""
    errors = [err for lst in (result.failures, result.errors) for t, err in lst if t is test]
    if not errors:
        return None
    lines = errors[0].rstrip().split("Traceback (most recent call last):")[-1].splitlines()
    frames = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("File ")]
    where = next((lines[i].strip() for i in reversed(frames)
                  if ", in test" in lines[i]), None)
    message = [ln for ln in lines[frames[-1] + 1 if frames else 0:] if ln and not ln[0].isspace()]
    if message:
        message[0] = message[0].split(": ", 1)[-1]
    return where, "\n".join(message)


def _eager_triage(cls, name, patches, timeout, test, result):
    """A direct case that failed under kiln, run again with its own compile as the identity.
    Failing the same way there (same line, same message), its checks assert the compiler's own
    behaviour (Dynamo's compile counters, Inductor's code, its profiler names, an error eager
    does not raise), not eager's answers: (status, detail), or None to keep kiln's result."""
    mine = _failure_signature(result, test)
    record = dict(CASE)
    reset_case()
    try:
        eager_test, eager_result = _run_case(cls, name, _as_eager(patches), timeout)
    finally:
        CASE.update(record)
    if mine is None or mine[0] is None or mine != _failure_signature(eager_result, eager_test):
        return None
    return "not_kept", (f"fails the same way with torch.compile as the identity: it asserts "
                        f"Dynamo's or Inductor's own behaviour ({mine[0]}: "
                        f"{' '.join(mine[1].split())[:200]})")


def run_child(args):
    """Run the cases from --start on (every --stride-th), one JSON line each, flushed."""
    import warnings
    warnings.simplefilter("ignore")
    cases = collect(args)
    inductor = _inductor_cases(args.inductor) if args.inductor else None
    functions = _functions_cases(args.functions) if args.functions else None
    if args.eager_compile:
        inductor = inductor and inductor[:-1] + (_as_eager(inductor[-1]),)
        functions = functions and functions[:-1] + (_as_eager(functions[-1]),)
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
        reset_case()
        if "aoti" in name:  # AOTInductor's own eager mode and packaging, not a compiler test
            print(json.dumps({"index": index, "file": file, "case": f"{clsname}.{name}",
                              "status": "not_kept", "detail": "tests AOTInductor"}),
                  file=out, flush=True)
            continue
        started = time.perf_counter()
        test, result = _run_case(cls, name, patches, args.timeout)
        status, detail = _classify(result, test)
        if CASE["direct"] and status in ("mismatch", "error") and not args.eager_compile:
            status, detail = _eager_triage(cls, name, patches, args.timeout, test, result) \
                or (status, detail)
        if CASE["direct"] and status in ("pass", "mismatch", "error"):
            status = "direct_" + status
        row = {"index": index, "file": file, "case": f"{clsname}.{name}", "status": status,
               "detail": detail, "seconds": round(time.perf_counter() - started, 2),
               **{k: CASE[k] for k in ("kiln_calls", "fallbacks", "eager_runs", "breaks",
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
