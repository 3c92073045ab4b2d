"""bf16 stores in runs: a pointwise kernel's inner loop stores its bf16 outputs in chunks.

gcc vectorizes the per-element float -> bf16 rounding (``kiln_float_to_bf16``: add the
rounding bias, shift, blend NaNs) into about a dozen integer instructions per vector, and it
dominated a bf16 kernel: ``relu(x + b) * 2`` at 2048x2048 ran at 513 us where the same loop in
float32, moving twice the bytes, ran at 240 us. So a store that is contiguous along the inner
loop writes its float values to a local chunk of ``RUN`` elements instead, and
``kiln_store_bf16_run`` converts the chunk once the chunk's loop is done:

- with AVX512-BF16 (``__AVX512BF16__``, from ``-march=native``), 16 lanes at a time through
  ``vcvtneps2bf16`` (round to nearest even, NaN stays NaN). That instruction flushes
  denormals to zero, which rounding does not: a 16-lane group holding a float below
  ``FLT_MIN`` in magnitude (other than zero) takes the exact path instead;
- elsewhere, element by element through ``kiln_float_to_bf16`` in a loop of its own, which gcc
  also vectorizes better than the fused one.

The chunk loop keeps ``omp simd``; loads and everything else are unchanged. A row pass of a
C++ row reduction (softmax's or layer norm's output pass) writes its bf16 row stores to a float
row of up to ``ROW_MAX`` elements and rounds the row after the pass (``cpp_reduction.py``).
``config.cpp_bf16_runs`` (``KILN_CONFIG=cpp_bf16_runs=0``) turns this off for an A/B.
"""
from __future__ import annotations

import sympy

from kiln.inductor import ir

RUN = 64

HELPER = r"""#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#endif
static inline void kiln_store_bf16_run(uint16_t* __restrict__ dst, const float* __restrict__ src, int64_t n) {
    int64_t j = 0;
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    const __m512 kiln_min_normal = _mm512_set1_ps(1.17549435e-38f);
    for (; j + 16 <= n; j += 16) {
        const __m512 v = _mm512_loadu_ps(src + j);
        const __m512 a = _mm512_abs_ps(v);
        // a denormal lane: vcvtneps2bf16 would flush it, so the group rounds exactly below
        if (_mm512_cmp_ps_mask(a, kiln_min_normal, _CMP_LT_OQ) & _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NEQ_OQ)) {
            for (int64_t k = j; k < j + 16; ++k) dst[k] = kiln_float_to_bf16(src[k]);
            continue;
        }
        _mm256_storeu_si256((__m256i*)(dst + j), (__m256i)_mm512_cvtneps_pbh(v));
    }
#endif
    const int64_t rest = n - j;
    #pragma omp simd
    for (int64_t k = 0; k < rest; ++k) dst[j + k] = kiln_float_to_bf16(src[j + k]);
}"""


ROW_MAX = 8192  # a row pass rounds a whole row at once: a float row on each thread's stack


def is_run_store(index, last: int, ranges) -> bool:
    """Whether a store index moves by exactly one element per step of loop ``i{last}``."""
    return moves_by_one(ir.simplify_index(index, ranges), ir.index_symbol(last))


def moves_by_one(index, sym) -> bool:
    expr = sympy.expand(index)
    if sym not in expr.free_symbols:
        return False
    return expr.coeff(sym, 1) == 1 and sym not in (expr - sym).free_symbols


def float_value(stored: str) -> str | None:
    """The float expression a bf16 store converts (``kiln_float_to_bf16(<it>)``)."""
    head = "kiln_float_to_bf16("
    return stored[len(head):-1] if stored.startswith(head) and stored.endswith(")") else None


def chunk_loop(var: str, extent: str, body: list[str], runs: list[tuple], indent: str) -> list[str]:
    """The inner loop over ``var`` in [0, extent) as chunks of RUN elements; ``body`` is the
    writer's lines, ``runs`` the (chunk array, output pointer, index text) of the bf16 run
    stores the body writes into ``array[var - kc]``."""
    out = [f"{indent}for (int64_t kc = 0; kc < {extent}; kc += {RUN}) {{",
           f"{indent}    const int64_t kn = {extent} - kc < {RUN} ? {extent} - kc : {RUN};"]
    out += [f"{indent}    float {arr}[{RUN}];" for arr, _, _ in runs]
    out += [f"{indent}    #pragma omp simd",
            f"{indent}    for (int64_t {var} = kc; {var} < kc + kn; ++{var}) {{"]
    out += [indent + "        " + ln for ln in body]
    out += [f"{indent}    }}", f"{indent}    {{", f"{indent}        const int64_t {var} = kc;"]
    out += [f"{indent}        kiln_store_bf16_run(&{ptr}[{idx}], {arr}, kn);" for arr, ptr, idx in runs]
    out += [f"{indent}    }}", f"{indent}}}"]
    return out
