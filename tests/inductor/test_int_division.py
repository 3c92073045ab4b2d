"""Integer ``//``, ``%``, ``fmod`` and ``div(rounding_mode=...)`` never trap (issue 24, item 3).

Before, a zero divisor or MIN // -1 reached the hardware divide of the C++ kernel: SIGFPE for
a tensor divisor, SIGILL for a constant 0 (gcc compiles the known-undefined divide to ``ud2``).
Now the C++ kernel reports a zero divisor through its ``_check()`` flags and the wrapper raises
eager's ``RuntimeError: ZeroDivisionError``; MIN // -1 wraps to MIN and its remainder is 0, as
eager's floor_divide does. (Eager CPU's own ``div(rounding_mode="trunc")`` of int32/int64 MIN
by -1 dies of SIGFPE in torch 2.13: kiln wraps there too.)

CUDA eager does not raise: its values for a zero divisor are what the GPU's divide gives. The
Triton kernel produces those (``codegen/triton.py int_division``), measured on the H200 with
torch 2.11 (``CUDA_EAGER_BY_ZERO``); in interpreter mode, where numpy would divide by zero with
a warning, the kernel never divides by zero at all (the crash tests turn warnings into errors).

The crash tests run the division in a subprocess, so a signal fails the test, not pytest.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import kiln
from testing import TARGETS, on_target

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
CHILD_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64]  # int16 is int32's case
OPS = {
    "floordiv": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": torch.fmod,
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
}


def _all_ops(a, b):
    return tuple(f(a, b) for f in OPS.values())


def _operands(dtype, n=97):
    """Random dividends (the type's extremes included) and divisors that are never 0, with
    -1 among them; no MIN // -1 pair (eager's trunc of it traps, see the crash test)."""
    info = torch.iinfo(dtype)
    lo = 0 if dtype == torch.uint8 else max(info.min, -300)
    a = torch.randint(lo, min(info.max, 300) + 1, (n,), dtype=torch.int64).to(dtype)
    a[:2] = torch.tensor([info.max, info.min + (0 if dtype == torch.uint8 else 1)], dtype=dtype)
    b = torch.randint(lo // 30 if lo else 1, 12, (n,), dtype=torch.int64).to(dtype)
    b[b == 0] = 1
    if dtype.is_signed:
        b[2:5] = -1
    return a, b


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_integer_division_matches_eager(dtype, target):
    a, b = _operands(dtype)
    scalar = -7 if dtype.is_signed else 7
    cases = [(_all_ops, (a, b)),
             (lambda a: _all_ops(a, scalar), (a,)),
             (lambda b: tuple(f(37, b) for f in OPS.values() if f is not torch.fmod), (b,)),
             (lambda a, b: _all_ops(a, b[:1].reshape(())), (a, b))]  # a 0-d tensor divisor
    with on_target(target) as device, kiln.config.patch(strict=True):
        for fn, args in cases:
            args = [x.to(device) for x in args]
            got, want = kiln.compile(fn)(*args), fn(*args)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and torch.equal(g.cpu(), w.cpu()), (fn, g, w)
    assert kiln.stats()["fallbacks"] == 0


# CUDA eager (torch 2.11, H200) for the dividends VALUES[dtype] divided by a zero tensor (a zero
# Python scalar gives the same): floordiv, remainder, fmod, trunc, floor
VALUES = {dt: [5, -5, 0, 1, -1, torch.iinfo(dt).min, torch.iinfo(dt).max] for dt in DTYPES}
VALUES[torch.uint8] = [5, 0, 1, 255]
_SIGNED = {"floordiv": [-1, -2, -1, -1, -2, -2, -1], "remainder": [-1] * 7, "fmod": [-1] * 7,
           "trunc": [-1] * 7, "floor": [-1, -2, -1, -1, -2, -2, -1]}
_WIDE = 4294967295
CUDA_EAGER_BY_ZERO = {
    torch.int8: _SIGNED, torch.int16: _SIGNED, torch.int32: _SIGNED,
    torch.uint8: {op: [255] * 4 for op in OPS},
    torch.int64: {"floordiv": [_WIDE, -2, _WIDE, _WIDE, -2, -2, -1], "remainder": [_WIDE, -1, _WIDE, _WIDE, -1, -1, -1],
                  "fmod": [_WIDE, -1, _WIDE, _WIDE, -1, -1, -1], "trunc": [_WIDE, -1, _WIDE, _WIDE, -1, -1, -1],
                  "floor": [_WIDE, -2, _WIDE, _WIDE, -2, -2, -1]},
}

# Run in a child process: compiled OP on every dtype, by a zero tensor, a zero scalar and -1
# (tensor and scalar), one JSON line per case: the values, or the exception raised.
_CHILD = r"""
import json, os, sys
import torch, kiln
sys.path[:0] = [sys.argv[3], os.path.dirname(sys.argv[3])]
from test_int_division import CHILD_DTYPES, OPS, VALUES
kiln.config.cpu_backend = sys.argv[2]
kiln.config.strict = True
f = OPS[sys.argv[1]]
by_tensor = kiln.compile(lambda a, b: f(a, b))
for dtype in CHILD_DTYPES:
    a = torch.tensor(VALUES[dtype], dtype=dtype)
    for case in ("zero", "minus_one"):
        if case == "minus_one" and not dtype.is_signed:
            continue
        value = 0 if case == "zero" else -1
        kiln.reset()
        for kind, run in (("tensor", lambda: by_tensor(a, torch.full_like(a, value))),
                          ("scalar", lambda: kiln.compile(lambda a: f(a, value))(a))):
            try:
                out = {"values": run().tolist()}
            except Exception as e:
                out = {"raised": f"{type(e).__name__}: {e}"}
            out.update(dtype=str(dtype), case=case, kind=kind, fallbacks=kiln.stats()["fallbacks"])
            print(json.dumps(out), flush=True)
"""


def _child(code: str, *argv: str):
    """Run ``code`` in a fresh Python (numpy's division warnings as errors): a signal there
    fails the test instead of killing pytest."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code, *argv],
                          capture_output=True, text=True, env=env, timeout=600)


def _wrapped_minus_one(op, dtype):
    """MIN // -1 wraps to MIN (floordiv, trunc, floor), its remainder is 0: eager's values."""
    bits = 8 * dtype.itemsize
    wrap = [((-v + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1)) for v in VALUES[dtype]]
    return wrap if op in ("floordiv", "trunc", "floor") else [0] * len(VALUES[dtype])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", list(OPS))
def test_division_by_zero_and_min_by_minus_one_do_not_crash(op, target):
    device, backend = target
    if device != "cpu":
        pytest.skip("the child process runs on the CPU (C++ or the Triton interpreter)")
    proc = _child(_CHILD, op, backend, os.path.dirname(os.path.abspath(__file__)))
    assert proc.returncode == 0, f"the child died (status {proc.returncode}):\n{proc.stderr[-3000:]}"
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(rows) == 2 * (len(CHILD_DTYPES) + sum(dt.is_signed for dt in CHILD_DTYPES))
    for row in rows:
        dtype = getattr(torch, row["dtype"].split(".")[1])
        assert row["fallbacks"] == 0, row
        if row["case"] == "minus_one":
            assert row.get("values") == _wrapped_minus_one(op, dtype), row
        elif backend == "cpp":  # eager CPU raises, and so does the compiled kernel
            with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
                OPS[op](torch.tensor(VALUES[dtype], dtype=dtype), 0)
            assert row.get("raised") == "RuntimeError: ZeroDivisionError", row
        else:  # Triton: CUDA eager's values
            assert row.get("values") == CUDA_EAGER_BY_ZERO[dtype][op], row


def test_minus_one_matches_eager_floor_divide():
    """The wrapped values of the crash test are eager's own where eager computes them."""
    for dtype in (torch.int8, torch.int32, torch.int64):
        a = torch.tensor(VALUES[dtype], dtype=dtype)
        for op in ("floordiv", "remainder", "fmod", "floor"):
            assert OPS[op](a, -1).tolist() == _wrapped_minus_one(op, dtype)


_CLEARS = r"""
import torch, kiln
kiln.config.cpu_backend, kiln.config.strict = "cpp", True
fn = kiln.compile(lambda a, b: a // b + a % b)
a, b = torch.randint(-50, 50, (64,)), torch.randint(1, 9, (64,))
assert torch.equal(fn(a, b), a // b + a % b)
b[17] = 0
try:
    fn(a, b)
    raise AssertionError("no error for a zero divisor")
except RuntimeError as e:
    assert str(e) == "ZeroDivisionError", e
b[17] = 3
assert torch.equal(fn(a, b), a // b + a % b)
assert kiln.stats()["fallbacks"] == 0
print("ok")
"""


def test_a_zero_divisor_raises_per_call_and_clears():
    """The flag is read (and cleared) after every call: a later call with good divisors runs."""
    proc = _child(_CLEARS)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-3000:])


def test_a_constant_divisor_stays_vectorized(tmp_path):
    """The zero and -1 tests fold away for a constant divisor: gcc still vectorizes x // 4."""
    from test_cpp_vectorized import _all_vectorized, _sources, _vectorized_lines
    x = torch.randint(-100, 100, (64, 255), dtype=torch.int32).t()  # 2-D: a `#pragma omp simd` row loop
    for fn in (lambda x: x // 4 + x % 8, lambda x: torch.fmod(x, -3) * 2, lambda x: torch.div(x, -1, rounding_mode="trunc")):
        (source,) = _sources(fn, x)
        assert "kiln_idiv" in source or "kiln_imod" in source
        assert _all_vectorized(*_vectorized_lines(source, tmp_path)), source
