"""gcc vectorizes the row loops kiln writes: every ``#pragma omp simd`` loop of a batch norm +
ReLU training forward (whose output pass also stores the ReLU's bool mask) and of a softmax
(whose first pass is a max) is reported vectorized by gcc's own ``-fopt-info-vec``. Before
session 21, ``kiln_max``'s short-circuit ``||`` (control flow) and stores through ``bool*``
("complicated access pattern") left those loops scalar."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.config import config

pytestmark = pytest.mark.skipif(shutil.which(config.cpp_compiler) is None, reason="no C++ compiler")


def _vectorized_lines(source: str, tmp_path, march=None) -> tuple[set, list]:
    """``march``: compile for that target instead of this host's (``-march=native``), to check
    a vectorization that depends on the ISA (AVX-512's mask registers) on any host."""
    path = os.path.join(tmp_path, "k.cpp")
    with open(path, "w") as f:
        f.write(source)
    flags = [f for f in config.cpp_flags if f not in ("-shared",)]
    if march is not None:
        flags = [f"-march={march}" if f.startswith("-march=") else f for f in flags]
    proc = subprocess.run([config.cpp_compiler, *flags, "-c", "-fopt-info-vec-optimized", path,
                           "-o", os.path.join(tmp_path, "k.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = {int(m.group(1)) for m in re.finditer(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", proc.stderr)}
    lines = source.split("\n")
    simd = [i + 1 for i, ln in enumerate(lines)  # 1-based; `parallel for simd` loops too
            if ln.strip().startswith("#pragma omp") and ln.strip().endswith(" simd")]
    return done, simd


def _all_vectorized(done, simd) -> bool:
    """Each simd pragma's loop is reported vectorized (gcc names a line of the loop: its header
    or a statement of its body, before the next pragma)."""
    ends = simd[1:] + [10 ** 9]
    return bool(simd) and all(any(p < line < end for line in done) for p, end in zip(simd, ends))


def _sources(fn, *args):
    with kiln.config.patch(strict=True, cpu_backend="cpp"):
        r = kiln.explain(fn)(*args)
    return [k.source for k in r.kernels]


def test_batch_norm_relu_training_loops_vectorize(tmp_path):
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)

    def fn(x):
        return F.relu(F.batch_norm(x, None, None, w, b, training=True))
    sources = _sources(fn, x)
    main = [s for s in sources if "acc0" in s]
    assert main and any("uint8_t* __restrict__" in s for s in main)  # the ReLU's mask, as bytes
    for source in main:
        done, simd = _vectorized_lines(source, tmp_path)
        assert _all_vectorized(done, simd), (sorted(done), simd)


def test_softmax_max_pass_vectorizes(tmp_path):
    x = torch.randn(64, 256)
    (source,) = _sources(lambda x: torch.softmax(x, -1), x)
    assert "kiln_max" in source
    done, simd = _vectorized_lines(source, tmp_path)
    assert _all_vectorized(done, simd), (sorted(done), simd)


def test_max_pool_window_chain_vectorizes(tmp_path):
    """Nine window maxima over stride-2 loads: with kiln_max's | form gcc reported "no vectype"
    for the loads and left the loop scalar (4.7 ms for an [8, 64, 56, 56] input against 1.3 ms
    vectorized); between two computed values CppOps now writes the nested-select form."""
    x = torch.randn(2, 4, 64, 64)

    def pool(x):
        return F.max_pool2d(x, 3, 2, 1)
    chains = [s for s in _sources(pool, x) if "kiln_maxc<float>(tmp" in s]
    assert len(chains) == 1 and chains[0].count("kiln_maxc<float>(") == 8
    done, simd = _vectorized_lines(chains[0], tmp_path)
    assert _all_vectorized(done, simd), (sorted(done), simd)


@pytest.mark.parametrize("args, helper", [
    (["tmp3", "0.0f"], "kiln_max"), (["tmp3", "float(1e-05)"], "kiln_max"), (["5LL", "tmp1"], "kiln_max"),
    (["tmp3", "(-std::numeric_limits<float>::infinity())"], "kiln_max"), (["tmp3", "tmp4"], "kiln_maxc"),
    (["acc0", "in_ptr0[2*i3 + 1]"], "kiln_maxc"),
])
def test_min_max_helper_by_operand(args, helper):
    from kiln.inductor.codegen.cpp import _minmax_helper
    assert _minmax_helper("maximum", args) == helper
    assert _minmax_helper("minimum", args) == helper.replace("max", "min")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_both_helpers_propagate_nan_and_match_eager(dtype):
    """maximum/minimum between computed values (the nested-select helper) and against a
    constant (the | helper), with NaNs on either side, against eager."""
    torch.manual_seed(0)
    if dtype.is_floating_point:
        a, b = torch.randn(64, 33, dtype=dtype), torch.randn(64, 33, dtype=dtype)
        a[::5, ::3], b[::7, 1::4] = float("nan"), float("nan")
    else:
        a, b = torch.randint(-9, 9, (64, 33), dtype=dtype), torch.randint(-9, 9, (64, 33), dtype=dtype)

    def fn(a, b):
        return torch.maximum(a, b * 2), torch.minimum(a + 1, b), torch.clamp(a, min=0), torch.relu(b)
    got = kiln.compile(fn)(a, b)
    for g, w in zip(got, fn(a, b)):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_small_flat_pointwise_loop_vectorizes(tmp_path):
    """A flat pointwise loop below the threads threshold: gcc 12 left a combined
    ``parallel for simd if(0)`` loop scalar (a Llama MLP's SiLU * up at [128, 384]: 515 us,
    eager 65 us); it is now a plain simd loop."""
    torch.manual_seed(0)
    a, b = torch.randn(64, 96), torch.randn(64, 96)

    def fn(a, b):
        return F.silu(a) * b
    (source,) = _sources(fn, a, b)
    assert "if(0)" not in source and "kiln_expf" in source
    done, simd = _vectorized_lines(source, tmp_path)
    assert _all_vectorized(done, simd), (sorted(done), simd)
    a, b = torch.randn(64, 96), torch.randn(64, 96)
    torch.testing.assert_close(kiln.compile(fn)(a, b), fn(a, b))


def test_exact_gelu_loops_vectorize(tmp_path):
    """GELU's exact form (BERT, ViT) calls erf: glibc's erff left its loops scalar (1.36 ms for
    [2, 64, 512], eager 0.09 ms); kiln_erff is branch-free and vectorizes, forward and backward."""
    x = torch.randn(2, 64, 512, requires_grad=True)
    sources = _sources(lambda x: F.gelu(x).sum(), x)
    sources += _sources(lambda x: torch.autograd.grad(F.gelu(x).sum(), x)[0], x)
    erf = [s for s in sources if "kiln_erff(" in s]
    assert erf and not any("std::erf(" in s for s in sources)
    for source in erf:
        done, simd = _vectorized_lines(source, tmp_path)
        assert _all_vectorized(done, simd), (sorted(done), simd)


_ACTIVATIONS = {  # lambdas: compiling F.elu itself traces into it, to torch._C._nn.elu
    "sigmoid": lambda x: torch.sigmoid(x), "tanh": lambda x: torch.tanh(x), "exp": lambda x: torch.exp(x),
    "hardtanh": lambda x: F.hardtanh(x), "relu6": lambda x: F.relu6(x), "hardswish": lambda x: F.hardswish(x),
    "silu": lambda x: F.silu(x), "elu": lambda x: F.elu(x), "mish": lambda x: F.mish(x),
    "softplus": lambda x: F.softplus(x), "log1p": lambda x: torch.log1p(x.abs()), "expm1": lambda x: torch.expm1(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "leaky_relu": lambda x: F.leaky_relu(x),
    "clamp": lambda x: x.clamp(-1.0, 2.0), "where": lambda x: torch.where(x > 0, x, x * 0.1),
    "sqrt": lambda x: x.abs().sqrt(),
}


@pytest.mark.parametrize("name", sorted(_ACTIVATIONS))
def test_activation_loops_vectorize(name, tmp_path):
    """Every loop of a pointwise activation is vectorized. On an AVX2 host (no AVX-512 masks)
    gcc 12 if-converts no float compare under its default -ftrapping-math, so each clamp,
    select and kiln_expf left its loop scalar (a Llama SiLU backward [128, 384]: 0.45 ms) until
    cpp_flags gained -fno-trapping-math; -fno-math-errno lets sqrt inline."""
    torch.manual_seed(0)
    fn = _ACTIVATIONS[name]
    x = torch.randn(64, 1024)
    sources = _sources(fn, x)
    assert sources
    for source in sources:
        done, simd = _vectorized_lines(source, tmp_path)
        assert _all_vectorized(done, simd), (name, sorted(done), simd, source)
    x = torch.randn(64, 1024)
    # tanh saturates to exactly +-1 past 9.01 (kiln_tanhf clamped at 9 gave 0.99999994, and
    # gelu_tanh(-inf) became -inf instead of eager's nan)
    x[0, :9] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 9.5, -12.0, 50.0, -1e30])
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x), equal_nan=True)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _rope(q, cos, sin):
    return q * cos + _rotate_half(q) * sin


@pytest.mark.parametrize("head_dim", [32, 64, 24])
def test_rope_rotate_half_loop_is_split_and_vectorizes(head_dim, tmp_path):
    """RoPE's rotate_half reads the row at Mod(i, d/2) and Mod(i, d/2) + d/2: gcc left such
    loops scalar ("no vectype" for the loads). The row now loops as [2, d/2] with affine
    indices (split_inner_dim), for d/2 of at least 8; d = 24 (12 + 12) splits too, and the
    values match eager forward and backward, on a non-contiguous q as well."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, head_dim)
    cos, sin = torch.randn(16, head_dim), torch.randn(16, head_dim)
    (source,) = _sources(_rope, q, cos, sin)
    assert "%" not in source.split("#pragma omp simd")[1], source  # no modulo in the row
    done, simd = _vectorized_lines(source, tmp_path)
    assert _all_vectorized(done, simd), (sorted(done), simd, source)
    qt = torch.randn(2, 16, 4, head_dim).transpose(1, 2).requires_grad_()
    ref = qt.detach().clone().requires_grad_()
    out = kiln.compile(_rope)(qt, cos, sin)
    torch.testing.assert_close(out, _rope(ref, cos, sin))
    g = torch.randn_like(out)
    out.backward(g)
    _rope(ref, cos, sin).backward(g)
    torch.testing.assert_close(qt.grad, ref.grad)


def test_split_leaves_two_moduli_alone():
    """Indices modulo two different constants (24 and 16 over a row of 48) keep the row as
    one loop, and the values match eager."""
    torch.manual_seed(0)
    x = torch.randn(4, 48)

    def fn(x):
        return torch.cat((x[:, 24:], x[:, :24]), -1) + torch.cat((x[:, 16:], x[:, :16]), -1)
    sources = _sources(fn, x)
    assert any("< 48; ++i1)" in s for s in sources), sources
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bool_to_float_loop_vectorizes(dtype, tmp_path):
    """A bool tensor promoted to float is a select (1 or 0), not a static_cast: gcc 12 left
    the cast's loop scalar ("no vectype" for the store)."""
    torch.manual_seed(0)
    m, x = torch.rand(64, 1024) > 0.5, torch.randn(64, 1024, dtype=dtype)

    def fn(m, x):
        return m.to(dtype) * x
    (source,) = _sources(fn, m, x)
    # this host, then AVX2 and AVX-512 targets: the select `b ? 1.0 : 0.0` vectorized on AVX2
    # and stayed scalar for double on the H100 host's Xeon (AVX-512)
    for march in (None, "haswell", "skylake-avx512"):
        done, simd = _vectorized_lines(source, tmp_path, march)
        assert _all_vectorized(done, simd), (march, sorted(done), simd, source)
    torch.testing.assert_close(kiln.compile(fn)(m, x), fn(m, x))


@pytest.mark.parametrize("op", [torch.log1p, torch.expm1])
def test_log1p_expm1_helpers_are_accurate(op):
    """kiln_log1pf and kiln_expm1f (log and exp with the Goldberg/Kahan correction) are within
    2 ulp of eager over wide, small and tiny values, and give eager's specials: NaN, the
    infinities, -1, the overflow edge and the sign of zero."""
    torch.manual_seed(0)
    specials = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, -1.0, -0.9999999, 88.5, 88.8,
                89.5, -104.0, -200.0, 1e-45, -1e-45, 1e30]
    x = torch.cat([torch.randn(4096) * 10, torch.randn(1024) * 1e-3, torch.randn(1024) * 1e-8,
                   torch.tensor(specials)])
    with kiln.config.patch(cpu_backend="cpp"):
        got = kiln.compile(lambda x: op(x))(x)
    want = op(x)
    # atol: eager's log1p of the smallest denormal is 0 (Sleef), kiln's the denormal itself
    torch.testing.assert_close(got, want, equal_nan=True, rtol=2.5e-7, atol=3e-45)
    zero = (want == 0) & (got == 0)
    assert torch.equal(torch.signbit(got[zero]), torch.signbit(want[zero]))
