"""C++ code generation for fused pointwise kernels on the CPU.

The outer dimensions are collapsed into one loop that OpenMP splits across threads; the last
dimension is the inner loop, written branch-free so gcc vectorizes it (``omp simd``). Half
precision is computed in float and rounded where stored or cast, as the Triton path does.
"""
from __future__ import annotations

import math
import re

import sympy
import torch

from kiln.config import config
from kiln.inductor import ir
from kiln.inductor.codegen import cpp_runs, tuning
from kiln.inductor.codegen.cpp_loops import (collapse_inner_dims, collapsed_body, collapsed_index,
                                             split_inner_dim)
from kiln.inductor.codegen.cpp_hoist import hoist_row_invariants
from kiln.inductor.codegen.common import (IndexPrinter, KernelWriter, ScalarOps, compute_dtype,
                                          is_symbolic, size_params, size_text)

C_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "_Float16",
    torch.bfloat16: "uint16_t", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
}
# The element types kernel arguments point to. bool memory is read and written as uint8_t (the
# same bytes: torch stores a bool as 0 or 1 in one byte): gcc does not vectorize a loop that
# stores through a bool* ("complicated access pattern"), and a batch norm + ReLU's output pass,
# which also stores the ReLU's mask for the backward, ran as scalar code.
C_MEM_TYPES = {**C_TYPES, torch.bool: "uint8_t"}

PRELUDE = r"""
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
"""

# Helpers, each included only when the kernel uses it.
def _minmax_select(name: str, cmp: str) -> str:
    """A NaN-propagating max or min as nested selects (see HELPERS), per compiler version."""
    pick = f"(a {cmp} b ? a : b)"
    unordered = "".join(f"template <> inline {t} {name}({t} a, {t} b) {{ return __builtin_isunordered(a, b) ? a + b : {pick}; }}\n"
                        for t in ("float", "double"))
    # the select first, then the NaN test: with -fno-trapping-math gcc 12 leaves the
    # ``(a != a) ? a : pick`` order scalar over strided loads, and vectorizes this one with and
    # without the flag (same values: a NaN a gives a, a NaN b gives b from the select)
    return (f"template <typename T> static inline T {name}(T a, T b) {{ T m = {pick}; return (a != a) ? a : m; }}\n"
            f"#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13\n{unordered}#endif")


HELPERS = {
    "kiln_bf16_to_float": r"""static inline float kiln_bf16_to_float(uint16_t v) {
    uint32_t bits = ((uint32_t)v) << 16; float f; std::memcpy(&f, &bits, 4); return f;
}""",
    "kiln_float_to_bf16": r"""static inline uint16_t kiln_float_to_bf16(float f) {
    uint32_t bits; std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);  // NaN stays NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
    return (uint16_t)(bits >> 16);
}""",
    "kiln_round_bf16": "static inline float kiln_round_bf16(float f) { return kiln_bf16_to_float(kiln_float_to_bf16(f)); }",
    # | rather than ||: a short-circuit is control flow, and gcc then leaves the whole loop
    # (every ReLU's) unvectorized
    "kiln_max": "template <typename T> static inline T kiln_max(T a, T b) { return ((a > b) | (a != a)) ? a : b; }",
    "kiln_min": "template <typename T> static inline T kiln_min(T a, T b) { return ((a < b) | (a != a)) ? a : b; }",
    # the same values, as nested selects: gcc vectorizes chains of these over strided loads
    # (max_pool2d's windows), which it does not with the | form; but a ReLU's loop that also
    # stores its mask stays scalar with these. CppOps picks by operand: see _MINMAX.
    # gcc 13 leaves those chains scalar ("no vectype" for the loads) but vectorizes them when the
    # NaN test is one unordered compare of both operands (NaN + x is NaN), which gcc 12 does not:
    # each compiler gets the form it vectorizes (both seen with -fopt-info-vec on the max-pool
    # window chain with gcc 12.2 and gcc 13.3)
    "kiln_maxc": _minmax_select("kiln_maxc", ">"),
    "kiln_minc": _minmax_select("kiln_minc", "<"),
}


def _transpose8_helper(nbytes: int) -> str:
    """``kiln_t8x8_{nbytes}``: an 8x8 block of nbytes-byte elements transposed in vector
    registers (three butterfly stages of shuffles: 1x1, 2x2 then 4x4 sub-blocks swap),
    ``d[b * ds + a] = s[a * ss + b]``; the bits move, so one helper serves every type of a size."""
    bits, width = 8 * nbytes, 8 * nbytes
    v, i = f"kiln_v8u{bits}", f"kiln_v8i{bits}"

    def stage(src, dst, pairs, lo, hi):
        return "".join(f"    {dst}[{a}] = __builtin_shuffle({src}[{a}], {src}[{b}], ({i}){{{lo}}});\n"
                       f"    {dst}[{b}] = __builtin_shuffle({src}[{a}], {src}[{b}], ({i}){{{hi}}});\n"
                       for a, b in pairs)
    return (f"typedef uint{bits}_t {v} __attribute__((vector_size({width})));\n"
            f"typedef int{bits}_t {i} __attribute__((vector_size({width})));\n"
            f"static inline void kiln_t8x8_{nbytes}(const void* src, int64_t ss, void* dst, int64_t ds) {{\n"
            f"    const uint{bits}_t* s = (const uint{bits}_t*)src; uint{bits}_t* d = (uint{bits}_t*)dst;\n"
            f"    {v} r[8], t[8];\n"
            f"    for (int k = 0; k < 8; ++k) std::memcpy(&r[k], s + k * ss, {width});\n"
            + stage("r", "t", [(0, 1), (2, 3), (4, 5), (6, 7)], "0, 8, 2, 10, 4, 12, 6, 14", "1, 9, 3, 11, 5, 13, 7, 15")
            + stage("t", "r", [(0, 2), (1, 3), (4, 6), (5, 7)], "0, 1, 8, 9, 4, 5, 12, 13", "2, 3, 10, 11, 6, 7, 14, 15")
            + stage("r", "t", [(0, 4), (1, 5), (2, 6), (3, 7)], "0, 1, 2, 3, 8, 9, 10, 11", "4, 5, 6, 7, 12, 13, 14, 15")
            + f"    for (int k = 0; k < 8; ++k) std::memcpy(d + k * ds, &t[k], {width});\n}}")


for _n in (2, 4, 8):
    HELPERS[f"kiln_t8x8_{_n}"] = _transpose8_helper(_n)

HELPERS["kiln_rand"] = r"""// Philox-4x32-10, counter = element index, key = per-call seed and stream: uniform [0, 1)
static inline float kiln_rand(int64_t seed, int64_t stream, int64_t offset) {
    uint64_t key = (uint64_t)seed + (uint64_t)stream * 0x9E3779B97F4A7C15ull;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)((uint64_t)offset >> 32), c2 = 0, c3 = 0;
    for (int round = 0; round < 10; ++round) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}"""
# float32 math that gcc vectorizes: branch-free range reduction and polynomials (Cephes-style
# coefficients, about 1 ulp), special values selected at the end. glibc's scalar expf/logf/tanhf
# are not vectorized without -ffast-math, which would also drop NaN semantics.
HELPERS["kiln_bits"] = r"""static inline uint32_t kiln_f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static inline float kiln_u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }"""
HELPERS["kiln_expf"] = r"""static inline float kiln_expf(float x) {
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    float n = std::nearbyint(xc * 1.44269504088896341f);
    float r = std::fma(n, -0.693359375f, xc);
    r = std::fma(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = std::fma(p, r, 1.3981999507e-3f);
    p = std::fma(p, r, 8.3334519073e-3f);
    p = std::fma(p, r, 4.1665795894e-2f);
    p = std::fma(p, r, 1.6666665459e-1f);
    p = std::fma(p, r, 5.0000001201e-1f);
    float y = std::fma(p * r, r, r) + 1.0f;
    int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;  // two factors: 2^n may not be a normal float
    y = y * kiln_u2f((uint32_t)(n1 + 127) << 23) * kiln_u2f((uint32_t)(n2 + 127) << 23);
    return x != x ? x : y;
}"""
HELPERS["kiln_logf"] = r"""static inline float kiln_logf(float x) {
    bool sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.0f : x;  // subnormals: scale by 2^23 first
    uint32_t bits = kiln_f2u(xs);
    float e = (float)((int32_t)((bits >> 23) & 0xffu) - 126) - (sub ? 23.0f : 0.0f);
    float m = kiln_u2f((bits & 0x007fffffu) | 0x3f000000u);  // in [0.5, 1)
    bool low = m < 0.707106781186547524f;
    e = low ? e - 1.0f : e;
    m = low ? m + m - 1.0f : m - 1.0f;
    float z = m * m;
    float p = 7.0376836292e-2f;
    p = std::fma(p, m, -1.1514610310e-1f);
    p = std::fma(p, m, 1.1676998740e-1f);
    p = std::fma(p, m, -1.2420140846e-1f);
    p = std::fma(p, m, 1.4249322787e-1f);
    p = std::fma(p, m, -1.6668057665e-1f);
    p = std::fma(p, m, 2.0000714765e-1f);
    p = std::fma(p, m, -2.4999993993e-1f);
    p = std::fma(p, m, 3.3333331174e-1f);
    float y = p * m * z;
    y = std::fma(e, -2.12194440e-4f, y);
    y = std::fma(z, -0.5f, y);
    float r = std::fma(e, 0.693359375f, m + y);
    r = x == std::numeric_limits<float>::infinity() ? x : r;
    r = x == 0.0f ? -std::numeric_limits<float>::infinity() : r;
    return (x < 0.0f || x != x) ? std::numeric_limits<float>::quiet_NaN() : r;
}"""
HELPERS["kiln_tanhf"] = r"""static inline float kiln_tanhf(float x) {
    float a = std::fabs(x);
    float z = x * x;
    float p = -5.70498872745e-3f;  // |x| < 0.625: odd polynomial
    p = std::fma(p, z, 2.06390887954e-2f);
    p = std::fma(p, z, -5.37397155531e-2f);
    p = std::fma(p, z, 1.33314422036e-1f);
    p = std::fma(p, z, -3.33332819422e-1f);
    float small = std::fma(p * z, x, x);
    float big = 1.0f - 2.0f / (kiln_expf(2.0f * (a > 10.0f ? 10.0f : a)) + 1.0f);  // 1.0f from 9.01 on
    big = std::copysign(big, x);
    return a < 0.625f ? small : (x != x ? x : big);
}"""
# Integer division and remainder (trunc_div, fmod): neither a zero divisor nor MIN / -1 may
# reach the hardware divide, which traps on both (SIGFPE; SIGILL where gcc sees a constant 0).
# A zero divisor sets the flag that ``<kernel>_check()`` returns (bit 2: the wrapper raises
# eager's ``RuntimeError: ZeroDivisionError``); MIN / -1 wraps to MIN (remainder 0), as eager's
# floor_divide does. The flag is only ever set, never cleared, inside a kernel: OpenMP threads
# may race on it without losing a report. With a constant divisor gcc folds both tests away, so
# ``x // 4`` stays a vectorized multiply-shift.
HELPERS["kiln_zero_div"] = "static int kiln_zero_div = 0;"
HELPERS["kiln_idiv"] = r"""template <typename T> static inline T kiln_idiv(T a, T b) {
    if (b == 0) kiln_zero_div = 1;
    const bool neg1 = std::is_signed<T>::value & (b == T(-1));
    const T d = ((b == 0) | neg1) ? T(1) : b;
    return neg1 ? T(0 - (typename std::make_unsigned<T>::type)a) : T(a / d);
}"""
HELPERS["kiln_imod"] = r"""template <typename T> static inline T kiln_imod(T a, T b) {
    if (b == 0) kiln_zero_div = 1;
    const bool neg1 = std::is_signed<T>::value & (b == T(-1));
    const T d = ((b == 0) | neg1) ? T(1) : b;
    return neg1 ? T(0) : T(a % d);
}"""
# Shifts as eager's: a count outside [0, bits) gives 0 (left) or the sign fill (right: a >>
# (bits - 1), 0 for unsigned types), where C's shift is undefined; a left shift runs unsigned
# and wraps to the type (no signed overflow).
HELPERS["kiln_shl"] = r"""template <typename T> static inline T kiln_shl(T a, T b) {
    typedef typename std::make_unsigned<T>::type U;
    const bool ok = (b >= T(0)) & (b < T(sizeof(T) * 8));
    return ok ? T(U(U(a) << (ok ? b : T(0)))) : T(0);
}"""
HELPERS["kiln_shr"] = r"""template <typename T> static inline T kiln_shr(T a, T b) {
    const T top = T(sizeof(T) * 8 - 1);
    const bool ok = (b >= T(0)) & (b <= top);
    return ok ? T(a >> (ok ? b : T(0))) : (std::is_signed<T>::value ? T(a >> top) : T(0));
}"""
# Float to integer as x86 converts (eager's result there): a NaN or out-of-range value gives
# the type's minimum, for int32 and int64; narrower types take the low bits of the int32.
# A plain cast is undefined out of range, and under -fno-trapping-math gcc folds
# (float)(int)x into a truncation, so int_round_trip gave NaN for a NaN.
HELPERS["kiln_f2i"] = r"""template <typename I, typename F> static inline I kiln_f2i(F x) {
    typedef typename std::conditional<(sizeof(I) < 4), int32_t, I>::type W;
    const F lo = F(std::numeric_limits<W>::min());  // -2^31 or -2^63: exact in float and double
    const W w = (x >= lo && x < -lo) ? W(x) : std::numeric_limits<W>::min();
    return I(w);
}"""
HELPERS["kiln_sigmoidf"] = "static inline float kiln_sigmoidf(float x) { return 1.0f / (1.0f + kiln_expf(-x)); }"
# erf: glibc's erff is a scalar call that gcc does not vectorize (GELU's exact form in BERT and
# ViT: [2, 64, 512] took 1.36 ms, eager 0.09 ms; now 0.12-0.2 ms). Two polynomials, both
# evaluated and one selected, so the loop stays branch-free. The coefficients are least-squares
# fits on Chebyshev nodes against mpmath's erf (P relative, Q absolute in log(erfc)), rounded
# to float one at a time with the rest refitted: at most 1.6 ulp, 0.25 ulp on average, over
# every third float in [0, 4.5].
HELPERS["kiln_erff"] = r"""static inline float kiln_erff(float x) {
    float a = std::fabs(x);
    float t = x * x;  // |x| < 1.25: x * (1 + P(x^2))
    float p = 6.8425447352638e-07f;
    p = std::fma(p, t, -1.1848606845887844e-05f);
    p = std::fma(p, t, 0.00011477645603008568f);
    p = std::fma(p, t, -0.0008482226403430104f);
    p = std::fma(p, t, 0.0052193645387887955f);
    p = std::fma(p, t, -0.026864279061555862f);
    p = std::fma(p, t, 0.11283750087022781f);
    p = std::fma(p, t, -0.37612634897232056f);
    p = std::fma(p, t, 0.12837916612625122f);
    float small = std::fma(x, p, x);  // x * (1 + p): 2/sqrt(pi) is not a float
    // 1.25 <= |x| < 4: 1 - exp(Q(|x| - 2.625)), Q fitted to log(erfc(|x|)); beyond, +-1
    float u = (a < 4.0f ? a : 4.0f) - 2.625f;
    float q = -1.1727485798473936e-05f;
    q = std::fma(q, u, 7.213775825221092e-05f);
    q = std::fma(q, u, -0.00036616434226743877f);
    q = std::fma(q, u, 0.0019140011863783002f);
    q = std::fma(q, u, -0.009838823229074478f);
    q = std::fma(q, u, -0.9477691054344177f);
    q = std::fma(q, u, -5.589146614074707f);
    q = std::fma(q, u, -8.490669250488281f);
    float big = 1.0f - kiln_expf(q);
    big = a < 4.0f ? big : 1.0f;
    big = std::copysign(big, x);
    float y = a < 1.25f ? small : big;
    return x != x ? x : y;
}"""
# log1p and expm1 from the log and exp above, by the classic correction (Goldberg's, Kahan's):
# u = 1 + x (u = e^x) carries x's rounding error, and log(u) * x / (u - 1) cancels it, to a few
# ulp; near 0, where u == 1, the answer is x itself (-0 kept). elu, softplus and mish called
# libm's scalar forms
HELPERS["kiln_log1pf"] = r"""static inline float kiln_log1pf(float x) {
    float u = 1.0f + x;
    float r = kiln_logf(u) * (x / (u - 1.0f));
    r = u == 1.0f ? x : r;
    return x == std::numeric_limits<float>::infinity() ? x : r;
}"""
HELPERS["kiln_expm1f"] = r"""static inline float kiln_expm1f(float x) {
    float u = kiln_expf(x);
    float um1 = u - 1.0f;
    float r = um1 * (x / kiln_logf(u));
    r = um1 == -1.0f ? -1.0f : r;
    r = u == std::numeric_limits<float>::infinity() ? u : r;
    return u == 1.0f ? x : r;
}"""
# ops whose float32 form is the vectorizable helper above
VECTOR_MATH = {"exp": "kiln_expf", "log": "kiln_logf", "tanh": "kiln_tanhf", "sigmoid": "kiln_sigmoidf",
               "erf": "kiln_erff", "log1p": "kiln_log1pf", "expm1": "kiln_expm1f"}
HELPERS["kiln_store_bf16_run"] = cpp_runs.HELPER
HELPER_DEPS = {"kiln_round_bf16": ("kiln_bf16_to_float", "kiln_float_to_bf16"),
               "kiln_store_bf16_run": ("kiln_float_to_bf16",),
               "kiln_expf": ("kiln_bits",), "kiln_logf": ("kiln_bits",),
               "kiln_tanhf": ("kiln_expf", "kiln_bits"), "kiln_sigmoidf": ("kiln_expf", "kiln_bits"),
               "kiln_erff": ("kiln_expf", "kiln_bits"), "kiln_log1pf": ("kiln_logf", "kiln_bits"),
               "kiln_expm1f": ("kiln_expf", "kiln_logf", "kiln_bits"),
               "kiln_idiv": ("kiln_zero_div",), "kiln_imod": ("kiln_zero_div",)}

# libm calls with no vector form under -O3 (no -ffast-math): a loop holding one runs an element
# at a time. The rest of the table's std:: forms (abs, sqrt, rounding) are single instructions.
_VECTOR_STD = {"abs", "sqrt", "floor", "ceil", "trunc", "round"}


def scalar_math_call(op: str, dtype: torch.dtype) -> bool:
    """True when the op's C++ form at ``dtype`` is a scalar libm call (sin, cos, pow, erf in
    float64 ...): costly enough that lowering stores a multi-use value holding one rather than
    have every consumer recompute it (lower._recompute_is_costly)."""
    if op in VECTOR_MATH and compute_dtype(dtype) == torch.float32:
        return False
    if op == "sigmoid":  # float64 and the rest: std::exp
        return True
    return CppOps.TABLE.get(op, "").startswith("std::") and op not in _VECTOR_STD


def _helpers_for(code: str) -> str:
    used = [name for name in HELPERS if name in code]
    for name in list(used):
        used += [d for d in HELPER_DEPS.get(name, ()) if d not in used]
    return "\n".join(HELPERS[name] for name in HELPERS if name in used)


class CppOps(ScalarOps):
    name = "cpp"
    TABLE = {
        "add": "({0} + {1})",
        "sub": "({0} - {1})",
        "mul": "({0} * {1})",
        "div": "({0} / {1})",
        "neg": "(-{0})",
        "abs": "std::abs({0})",
        "exp": "std::exp({0})",
        "log": "std::log({0})",
        "sqrt": "std::sqrt({0})",
        "tanh": "std::tanh({0})",
        "eq": "({0} == {1})",
        "ne": "({0} != {1})",
        "lt": "({0} < {1})",
        "le": "({0} <= {1})",
        "gt": "({0} > {1})",
        "ge": "({0} >= {1})",
        "where": "({0} ? {1} : {2})",
        "rand": "kiln_rand({0}, {1}, {2})",
        # kiln/ops/prims_more.py
        "floor": "std::floor({0})",
        "ceil": "std::ceil({0})",
        "trunc": "std::trunc({0})",
        "round": "std::nearbyint({0})",  # the default rounding mode: half to even
        "sin": "std::sin({0})",
        "cos": "std::cos({0})",
        "erf": "std::erf({0})",
        "exp2": "std::exp2({0})",
        "expm1": "std::expm1({0})",
        "log2": "std::log2({0})",
        "log10": "std::log10({0})",
        "log1p": "std::log1p({0})",
        "pow": "std::pow({0}, {1})",
        "bitwise_and": "({0} & {1})",
        "bitwise_or": "({0} | {1})",
        "bitwise_xor": "({0} ^ {1})",
        "bitwise_not": "(~{0})",
    }

    def call(self, op, args, dtype, arg_dtypes):
        ct = ctype(compute_dtype(dtype))
        if op in VECTOR_MATH and compute_dtype(dtype) == torch.float32:
            return f"{VECTOR_MATH[op]}({args[0]})"
        if op == "sigmoid":
            return f"({ct}(1) / ({ct}(1) + std::exp(-{args[0]})))"
        if op == "rsqrt":
            return f"({ct}(1) / std::sqrt({args[0]}))"
        if op in ("maximum", "minimum"):
            return f"{_minmax_helper(op, args)}<{ct}>({args[0]}, {args[1]})"
        if op == "abs" and dtype == torch.bool:
            return args[0]
        if op == "fmod" and dtype.is_floating_point:
            return f"std::fmod({args[0]}, {args[1]})"
        if op in ("shift_left", "shift_right"):
            return f"kiln_sh{op[6]}<{ct}>({args[0]}, {args[1]})"
        if op in ("fmod", "trunc_div"):  # integers: see kiln_idiv
            return f"kiln_i{'mod' if op == 'fmod' else 'div'}<{ct}>({args[0]}, {args[1]})"
        return super().call(op, args, dtype, arg_dtypes)


# what cpp_const writes: 0.5f, 3, 5LL, float(1e-05), (-std::numeric_limits<float>::infinity()), true
_LITERAL = re.compile(r"^\(?[-+]?\d+\.?\d*([eE][-+]?\d+)?(f|LL)?\)?$|numeric_limits|^\w+\([-+0-9.eE]+\)$"
                      r"|^(true|false)$")


def _minmax_helper(op: str, args) -> str:
    """``kiln_max``/``kiln_min`` (the | form) against a constant (a ReLU, a clamp), the nested
    select form (``kiln_maxc``) between two computed values (window maxima, row maxima): each
    is the form gcc vectorizes in its usual loops (``tests/inductor/test_cpp_vectorized.py``)."""
    constant = any(_LITERAL.search(str(a).strip()) for a in args)
    return f"kiln_{op[:3]}" + ("" if constant else "c")


def ctype(dtype) -> str:
    """The C++ type values of dtype are computed in."""
    return C_TYPES[compute_dtype(dtype)]


def cpp_const(value, dtype) -> str:
    dtype = compute_dtype(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        t = C_TYPES[dtype]
        if math.isinf(v):
            return f"({'' if v > 0 else '-'}std::numeric_limits<{t}>::infinity())"
        if math.isnan(v):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        return f"{v!r}f" if dtype == torch.float32 and "e" not in repr(v) and "." in repr(v) \
            else f"{t}({v!r})"
    return f"{int(value)}LL" if dtype == torch.int64 else str(int(value))


def cpp_cast(x: str, src, dst) -> str:
    if dst == torch.float16:
        return f"(float)(_Float16)({x})"
    if dst == torch.bfloat16:
        return f"kiln_round_bf16((float)({x}))"
    if dst == torch.bool:
        return f"({x} != 0)"
    if src is not None and src.is_floating_point and not dst.is_floating_point and not dst.is_complex:
        return f"kiln_f2i<{C_TYPES[dst]}>({x})"
    if src == torch.bool and dst.is_floating_point:
        # through int32: gcc 12 leaves a direct bool -> float cast scalar on AVX2 (a mask
        # promoted for a multiply over the vocabulary: 128000 elements), and a select
        # `b ? 1.0 : 0.0` of a loaded bool scalar on AVX-512 for double (its mask lanes are
        # bytes; the H100 host's Xeon). The int32 step vectorizes on both, float and double.
        return f"static_cast<{ctype(dst)}>(static_cast<int32_t>({x}))"
    return f"static_cast<{ctype(dst)}>({x})"


class CppKernel:
    """Source plus the buffer names of its pointer arguments. ``checked`` kernels read indices
    from memory and export ``<name>_check()``, nonzero after an out-of-range index."""
    __slots__ = ("name", "source", "args", "numel", "origins", "checked", "sizes", "tune")

    def __init__(self, name, source, args, numel, origins, sizes=()):
        self.name, self.source, self.args, self.numel, self.origins = name, source, args, numel, origins
        self.checked = f"{name}_check" in source
        self.sizes = list(sizes)  # symbolic sizes passed after the pointers (int64_t s0 ...)
        self.tune = None  # autotune only: chunk choices (codegen/cpp_tune.py)


def cpp_store_value(writer, value: str, dtype) -> str:
    """The C++ expression that stores register ``value`` as ``dtype``. A value that is itself
    a rounding to that half type (``cast`` right before the store) is stored from its input:
    rounding twice to the same type gives the same bits, and skips a conversion per element."""
    if dtype in (torch.bfloat16, torch.float16):
        prefix = "kiln_round_bf16((float)(" if dtype == torch.bfloat16 else "(float)(_Float16)("
        suffix = "))" if dtype == torch.bfloat16 else ")"
        for text, reg in writer.cache.items():
            if reg == value and isinstance(text, str) and text.startswith(prefix) and text.endswith(suffix):
                value = text[len(prefix):-len(suffix)]
                break
    if dtype == torch.bfloat16:
        return f"kiln_float_to_bf16({value})"
    return f"static_cast<{C_TYPES[dtype]}>({value})"


def cpp_bounds_check(reg: str, bound: int) -> list[str]:
    # branch-free, into a local flag (``with_index_flag``): a branch storing to the volatile
    # error flag kept gcc from vectorizing every loop that gathers (T5's position-bias gather
    # ran 8 ns an element)
    return [f"{{ const bool kiln_bad = ({reg} < 0) | ({reg} >= {bound}); kiln_index_bad |= kiln_bad; "
            f"{reg} = kiln_bad ? 0 : {reg}; }}"]


_OMP_LOOP = re.compile(r"^\s*#pragma omp (parallel for|simd)\b")


def with_index_flag(code: str) -> str:
    """A kernel's code whose bounds checks (``cpp_bounds_check``) OR into a local
    ``kiln_index_bad``: declared at the top of the function, a ``reduction(|:...)`` of every
    parallel and simd loop (so threads and vector lanes each keep their own and combine them),
    and reported once into the volatile ``kiln_index_error`` at each exit."""
    if "kiln_index_bad |=" not in code:
        return code
    report = "if (kiln_index_bad) kiln_index_error = 1;"
    out = []
    for line in code.split("\n"):
        if line.startswith('extern "C" void ') and line.endswith("{"):
            out += [line, "    int kiln_index_bad = 0;"]
            continue
        if _OMP_LOOP.match(line):
            line += " reduction(|:kiln_index_bad)"
        elif line.strip() == "return;":
            line = line.replace("return;", f"{{ {report} return; }}")
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    if not out or out[-1] != "}":
        raise ValueError("[codegen:cpp] a checked kernel's code does not end its function with '}'")
    return "\n".join(out[:-1] + [f"    {report}", "}"])


# bits of what ``<kernel>_check()`` returns (codegen/wrapper.py kernel_error raises them)
INDEX_ERROR, ZERO_DIVISION = 1, 2


def index_check_support(name: str, code: str) -> str:
    """The exported reader of a kernel's error flags, for kernels that check indices or divide
    integers: ``INDEX_ERROR | ZERO_DIVISION`` bits, each cleared as it is read."""
    index = "kiln_index_error" in code
    divides = "kiln_idiv" in code or "kiln_imod" in code
    if not index and not divides:
        return ""
    reads = (["kiln_index_error"] if index else []) + (["(kiln_zero_div << 1)"] if divides else [])
    clear = (" kiln_index_error = 0;" if index else "") + (" kiln_zero_div = 0;" if divides else "")
    return (("static volatile int kiln_index_error = 0;\n" if index else "")
            + f'extern "C" int {name}_check(void) {{ int e = {" | ".join(reads)};{clear} return e; }}\n')


def cpp_load(ptr: str, index: str, dtype) -> str:
    """An element read as the float (or native) value kernels compute with."""
    text = f"{ptr}[{index}]"
    if dtype == torch.bfloat16:
        return f"kiln_bf16_to_float({text})"
    if dtype == torch.float16:
        return f"(float)({text})"
    return text


def cpp_declare(name: str, text: str, dtype) -> str:
    return f"{ctype(dtype)} {name} = {text};"


def generate_cpp(kernel, buffers: dict) -> CppKernel:
    if tuning.cpp_enabled():  # off by default: the source is then exactly the untuned one
        from kiln.inductor.codegen.cpp_tune import tunable
        return tunable(_generate_cpp(kernel, buffers))
    return _generate_cpp(kernel, buffers)


def _generate_cpp(kernel, buffers: dict) -> CppKernel:
    if kernel.is_reduction:
        from kiln.inductor.codegen.cpp_reduction import generate_cpp_reduction
        return generate_cpp_reduction(kernel, buffers)
    printer = IndexPrinter("/")
    shape, collapse = collapse_inner_dims(kernel)
    ranges0 = ir.ranges_of(kernel.shape)
    numel = math.prod(shape)
    name = f"kiln_{kernel.name}"
    in_names: dict[str, str] = {}
    out_names: dict[str, str] = {}
    ranges = ir.ranges_of(shape)

    def index_text(expr):
        return printer.doprint(ir.simplify_index(expr, ranges))

    def ptr(buf):
        if buf not in in_names:
            in_names[buf] = f"in_ptr{len(in_names)}"
        return in_names[buf]

    from kiln.inductor.codegen.triton_tiled import is_transposed_load, tile_plan
    plan = tile_plan(kernel, shape, ranges) if config.cpp_tile_2d and not collapse and not is_symbolic(numel) else None
    if plan is None and not collapse and config.cpp_split_modulo:
        shape, collapse = split_inner_dim(kernel)
        ranges = ir.ranges_of(shape)
    tiles: dict = {}  # (buffer, index) of a transposed load -> (tile array, raw element read, dtype)

    def load(ld: ir.Load):
        if plan is not None and is_transposed_load(ld.index, plan, ranges):
            key = (ld.buffer, ir.simplify_index(ld.index, ranges))
            if key not in tiles:
                cx = sympy.expand(key[1]).coeff(ir.index_symbol(plan[1]), 1)
                tiles[key] = (f"tile{len(tiles)}", f"{ptr(ld.buffer)}[{index_text(ld.index)}]", ld.dtype, cx)
            ydim, xdim = plan
            return cpp_load(tiles[key][0], f"(i{ydim} - ty0) * {CPP_TILE_X} + (i{xdim} - tx0)", ld.dtype)
        return cpp_load(ptr(ld.buffer), index_text(ld.index), ld.dtype)

    writer = KernelWriter(CppOps(), load, cpp_const, cpp_cast, cpp_declare)

    writer.canon = ir.canonical_index_fn(ranges)
    writer.index_value_fn = lambda e: f"static_cast<{ctype(e.dtype)}>({printer.doprint(ir.simplify_index(e.index, ranges))})"
    writer.bounds_check = cpp_bounds_check
    stores = set(kernel.stores)
    last = len(shape) - 1
    runs = []  # bf16 stores contiguous along the inner loop: written a chunk at a time (cpp_runs.py)
    for node in kernel.nodes:
        # in the kernel's symbols (horizontal fusion remaps), trailing dims collapsed
        body, index = kernel.body(node), kernel.store_index(node)
        if collapse:
            body, index = collapsed_body(body, collapse, ranges0), collapsed_index(index, collapse, ranges0)
        value = writer.emit(body)
        writer.in_registers[(node.name, writer.canon(index))] = value
        if node.name in stores:
            out = out_names.setdefault(node.name, f"out_ptr{len(out_names)}")
            stored = cpp_store_value(writer, value, node.dtype)
            fv = cpp_runs.float_value(stored) if node.dtype == torch.bfloat16 else None
            if (fv is not None and plan is None and last >= 0 and config.cpp_bf16_runs
                    and cpp_runs.is_run_store(index, last, ranges)):
                arr = f"kiln_run{len(runs)}"
                runs.append((arr, out, index_text(index)))
                writer.lines.append(f"{arr}[i{last} - kc] = {fv};")
            else:
                writer.lines.append(f"{out}[{index_text(index)}] = {stored};")

    params = [f"const {C_MEM_TYPES[buffers[b].dtype]}* __restrict__ {p}" for b, p in in_names.items()]
    params += [f"{C_MEM_TYPES[buffers[b].dtype]}* __restrict__ {p}" for b, p in out_names.items()]
    body = ["        " + ln for ln in writer.lines]
    ndim = len(shape)
    symbolic = is_symbolic(numel)
    text = lambda x: size_text(x, printer)  # noqa: E731 - sizes may be symbolic arguments
    lines = []
    # threads cost more than they save on small loops (decided at run time for symbolic sizes)
    clause = (f" if({text(numel)} >= 65536)" if symbolic else "") if symbolic or numel >= 1 << 16 else " if(0)"
    if plan is not None:
        lines += _tiled_loops(shape, plan, body, clause, tiles)
    elif ndim == 0:
        lines += ["    {"] + body + ["    }"]
    elif ndim == 1 and runs:
        lines += [f"    #pragma omp parallel for{clause}"]
        lines += cpp_runs.chunk_loop("i0", text(shape[0]), writer.lines, runs, "    ")
    elif ndim == 1:
        # a loop too small for threads is a plain simd loop: gcc 12 leaves a combined
        # `parallel for simd if(0)` loop scalar (SiLU * up at [128, 384]: 515 us, eager 65 us)
        pragma = "simd" if clause == " if(0)" else f"parallel for simd{clause}"
        lines += [f"    #pragma omp {pragma}", f"    for (int64_t i0 = 0; i0 < {text(shape[0])}; ++i0) {{"]
        lines += body + ["    }"]
    else:
        outer = math.prod(shape[:-1])
        last = ndim - 1
        lines += [f"    #pragma omp parallel for{clause}", f"    for (int64_t x0 = 0; x0 < {text(outer)}; ++x0) {{"]
        inner = 1
        for k in range(ndim - 2, -1, -1):
            div = f"(x0 / {text(inner)})" if not isinstance(inner, int) or inner > 1 else "x0"
            lines.append(f"        const int64_t i{k} = {div} % {text(shape[k])};" if k > 0
                         else f"        const int64_t i0 = {div};")
            inner = inner * shape[k]
        if runs:  # per-row values (a row's log(sum)) once per row, before the chunk loop
            hoisted, in_loop = hoist_row_invariants(writer.lines, loop_names={f"i{last}", "kc", "kn"})
            lines += ["        " + ln for ln in hoisted]
            lines += cpp_runs.chunk_loop(f"i{last}", text(shape[-1]), in_loop, runs, "        ")
            lines += ["    }"]
        else:  # the same before the vector loop
            hoisted, body = hoist_row_invariants(body, loop_names={f"i{last}"})
            lines += hoisted
            lines += ["        #pragma omp simd", f"        for (int64_t i{last} = 0; i{last} < {text(shape[-1])}; ++i{last}) {{"]
            lines += ["    " + ln for ln in body] + ["        }", "    }"]
    sizes = size_params(lines)
    params += [f"const int64_t {p}" for p in sizes]
    lines = [f'extern "C" void {name}({", ".join(params)}) {{'] + lines
    lines.append("}")
    header = [f"// from: {o}" for o in kernel.origins]
    code = "\n".join(lines)
    code = with_index_flag(code)
    source = "\n".join(header) + PRELUDE + _helpers_for(code) + "\n" + index_check_support(name, code) + "\n" + code + "\n"
    return CppKernel(name, source, list(in_names) + list(out_names), numel, list(kernel.origins), sizes)


# A pointwise kernel that stores along its last dim and loads an input contiguous along another
# dim (a transpose) walks [CPP_TILE_Y, CPP_TILE_X] tiles. Each transposed input's tile is first
# copied into a local array reading along its own contiguous dim, then the kernel reads that
# array along the store's dim: both sides run contiguous and vectorize, where one side used to
# miss the cache (and the TLB) at every element.
CPP_TILE_Y, CPP_TILE_X = 32, 32


def _tiled_loops(shape, plan, body, clause, tiles: dict) -> list[str]:
    """OpenMP over (other dims x tile rows x tile columns); per tile, each transposed input is
    copied to a local array, then rows of ``y`` each run along the last dim ``x`` (vectorized).
    codegen/triton_tiled.tile_plan picks the dims."""
    ydim, xdim = plan
    ny, nx = -(-shape[ydim] // CPP_TILE_Y), -(-shape[xdim] // CPP_TILE_X)
    rest = math.prod(s for d, s in enumerate(shape) if d not in plan)
    lines = [f"    #pragma omp parallel for{clause}",
             f"    for (int64_t t = 0; t < {rest * ny * nx}; ++t) {{",
             f"        const int64_t tx0 = (t % {nx}) * {CPP_TILE_X}, ty0 = ((t / {nx}) % {ny}) * {CPP_TILE_Y};",
             f"        const int64_t r = t / {nx * ny};"]
    inner = 1
    for d in range(len(shape) - 1, -1, -1):
        if d in plan:
            continue
        lines.append(f"        const int64_t i{d} = (r / {inner}) % {shape[d]};")
        inner *= shape[d]
    lines += [f"        const int64_t y_end = ty0 + {CPP_TILE_Y} < {shape[ydim]} ? ty0 + {CPP_TILE_Y} : {shape[ydim]};",
              f"        const int64_t x_end = tx0 + {CPP_TILE_X} < {shape[xdim]} ? tx0 + {CPP_TILE_X} : {shape[xdim]};"]
    for name, raw, dtype, cx in tiles.values():  # raw: the element as stored (bf16 bits, half, ...)
        copy = [f"for (int64_t i{xdim} = tx0; i{xdim} < x_end; ++i{xdim}) {{",
                "    #pragma omp simd",
                f"    for (int64_t i{ydim} = ty0; i{ydim} < y_end; ++i{ydim}) {{",
                f"        {name}[(i{ydim} - ty0) * {CPP_TILE_X} + (i{xdim} - tx0)] = {raw};",
                "    }", "}"]
        lines.append(f"        {C_TYPES[dtype]} {name}[{CPP_TILE_Y * CPP_TILE_X}];")
        size = torch.empty((), dtype=dtype).element_size()
        if size in (2, 4, 8) and isinstance(cx, (int, sympy.Integer)):
            # a full tile goes through 8x8 register transposes; a ragged edge element by element
            lines += [f"        if (y_end - ty0 == {CPP_TILE_Y} && x_end - tx0 == {CPP_TILE_X}) {{",
                      f"            for (int64_t bx = 0; bx < {CPP_TILE_X}; bx += 8) {{",
                      f"                for (int64_t by = 0; by < {CPP_TILE_Y}; by += 8) {{",
                      f"                    const int64_t i{xdim} = tx0 + bx, i{ydim} = ty0 + by;",
                      f"                    kiln_t8x8_{size}(&{raw}, {int(cx)}, &{name}[by * {CPP_TILE_X} + bx], {CPP_TILE_X});",
                      "                }", "            }", "        } else {"]
            lines += ["            " + ln for ln in copy] + ["        }"]
        else:
            lines += ["        " + ln for ln in copy]
    lines += [f"        for (int64_t i{ydim} = ty0; i{ydim} < y_end; ++i{ydim}) {{",
              "            #pragma omp simd",
              f"            for (int64_t i{xdim} = tx0; i{xdim} < x_end; ++i{xdim}) {{"]
    lines += ["        " + ln for ln in body] + ["            }", "        }", "    }"]
    return lines
