"""Reshaping a C++ pointwise kernel's loop nest before its code is written: trailing dims
every index walks as one run collapse into one inner loop (``collapse_inner_dims``), and a
last dim read through one modulo splits in two (``split_inner_dim``), so the inner loop's
indices are affine and gcc vectorizes it. Both return the new shape and a symbol map that
``collapsed_index``/``collapsed_body`` apply to the kernel's indices."""
from __future__ import annotations

import math

import sympy

from kiln.inductor import ir


def collapse_inner_dims(kernel):
    """(shape, symbol map) of a pointwise kernel whose trailing dims every index walks as one
    contiguous run (each dim's coefficient is the next one's times its size, in every load,
    store and index value): they become one inner loop, so a kernel over [4096, 3, 4] (a
    horizontal fusion's common refinement, or narrow trailing dims) vectorizes over 12
    elements, or 49152, instead of 4. Static shapes only; ({} when nothing merges)."""
    shape = tuple(kernel.shape)
    n = len(shape)
    if n < 2 or not all(isinstance(s, int) or getattr(s, "is_Integer", False) for s in shape):
        return shape, {}
    ranges = ir.ranges_of(shape)
    syms = ir.index_symbols(n)
    exprs = _kernel_indices(kernel, ranges)

    def linear_coeffs(e, ks):
        cs = [e.coeff(syms[k]) for k in ks]
        rest = sympy.expand(e - sum(c * syms[k] for c, k in zip(cs, ks)))
        if any(syms[k] in rest.free_symbols for k in ks) or any(c.free_symbols & set(syms) for c in cs):
            return None
        return cs

    g = n - 1
    while g > 0:
        ks = list(range(g - 1, n))
        ok = True
        for e in exprs:
            cs = linear_coeffs(e, ks)
            if cs is None or cs[0] != cs[1] * int(shape[g]):
                ok = False
                break
        if not ok:
            break
        g -= 1
    if g == n - 1:
        return shape, {}
    mapping = {syms[k]: sympy.Integer(0) for k in range(g, n - 1)}
    mapping[syms[n - 1]] = syms[g]
    new_shape = shape[:g] + (math.prod(int(s) for s in shape[g:]),)
    if not _register_reads_hold(kernel, mapping, ranges, new_shape):
        return shape, {}
    return new_shape, mapping


# the shortest inner run worth a split: one AVX2 vector of float32
_SPLIT_MIN_RUN = 8


def split_inner_dim(kernel):
    """(shape, symbol map) of a pointwise kernel whose indices take the last loop variable
    modulo (or floor-divided by) one constant C that divides its extent: the last dim of N
    becomes two, [N / C, C], so every index is affine in the new inner variable. RoPE's
    ``rotate_half`` reads ``x[..., Mod(i, 16)]`` and ``x[..., Mod(i, 16) + 16]``; gcc cannot
    vectorize a loop whose loads go through a modulo (it reports "no vectype" for them), and
    the whole row ran scalar. Static shapes only; ({} when nothing splits)."""
    shape = tuple(kernel.shape)
    n = len(shape)
    if n < 1 or not all(isinstance(s, int) or getattr(s, "is_Integer", False) for s in shape):
        return shape, {}
    ranges = ir.ranges_of(shape)
    i = ir.index_symbol(n - 1)
    exprs = _kernel_indices(kernel, ranges)
    moduli = set()
    for e in exprs:
        for f in e.atoms(sympy.Mod, sympy.floor):
            if i not in f.free_symbols:
                continue
            m = _modulus_of(f, i)
            if m is None:
                return shape, {}  # i inside another form: leave the kernel as it is
            moduli.add(m)
    size = int(shape[-1])
    if len(moduli) != 1:
        return shape, {}
    (c,) = moduli
    if not (_SPLIT_MIN_RUN <= c < size and size % c == 0):
        return shape, {}
    q, j = ir.index_symbol(n - 1), ir.index_symbol(n)
    mapping = {sympy.Mod(i, c): j, sympy.floor(i / c): q, i: c * q + j}
    new_shape = shape[:-1] + (size // c, c)
    if not _register_reads_hold(kernel, mapping, ranges, new_shape):
        return shape, {}
    return new_shape, mapping


def _modulus_of(f, i):
    """C of ``Mod(i, C)`` or ``floor(i / C)`` (a positive integer), else None."""
    if isinstance(f, sympy.Mod) and f.args[0] == i and f.args[1].is_Integer and f.args[1] > 0:
        return int(f.args[1])
    if isinstance(f, sympy.floor):
        num, den = sympy.fraction(sympy.together(f.args[0]))
        if num == i and den.is_Integer and den > 0:
            return int(den)
    return None


def collapsed_index(index, mapping, ranges):
    """An index in the collapsed symbols. The collapse holds for the index simplified under
    the kernel's own ranges, so it is simplified first: a raw ``Mod``/``floor`` those ranges
    make a no-op is not one over the merged symbol (``3*Mod(i0, 2) + Mod(i1 + floor(i0/2), 3)``
    is ``3*i0 + i1`` over [2, 3], but maps to ``Mod(i0, 3)``)."""
    return sympy.expand(ir.simplify_index(index, ranges)).xreplace(mapping)


def collapsed_body(expr, mapping, ranges):
    """A kernel body with every index in the collapsed symbols (``collapsed_index``)."""
    if isinstance(expr, ir.Load):
        return ir.Load(expr.buffer, collapsed_index(expr.index, mapping, ranges), expr.dtype)
    if isinstance(expr, ir.IndexValue):
        return ir.IndexValue(collapsed_index(expr.index, mapping, ranges), expr.dtype)
    if isinstance(expr, ir.Call):
        return ir.Call(expr.op, tuple(collapsed_body(a, mapping, ranges) for a in expr.args), expr.dtype)
    if isinstance(expr, ir.Let):
        return ir.Let(expr.symbol, collapsed_body(expr.value, mapping, ranges), expr.bound,
                      collapsed_body(expr.body, mapping, ranges), expr.wrap_negative)
    return expr


def _kernel_indices(kernel, ranges) -> list:
    """Every store, load and index-value index of a kernel, simplified under its ranges."""
    exprs = []
    for node in kernel.nodes:
        exprs.append(kernel.store_index(node))
        exprs += [e.index for e in ir.walk(kernel.body(node)) if isinstance(e, (ir.Load, ir.IndexValue))]
    return [sympy.expand(ir.simplify_index(e, ranges)) for e in exprs]


def _register_reads_hold(kernel, mapping, ranges, new_shape) -> bool:
    """An in-kernel value is read from a register only when the read's index equals its store
    index: whether that stays true in the new symbols (else the loops are left as they are)."""
    canon = ir.canonical_index_fn(ir.ranges_of(new_shape))
    inside = {node.name: node for node in kernel.nodes}
    for node in kernel.nodes:
        for ld in ir.walk(kernel.body(node)):
            if isinstance(ld, ir.Load) and ld.buffer in inside:
                store = collapsed_index(kernel.store_index(inside[ld.buffer]), mapping, ranges)
                if canon(collapsed_index(ld.index, mapping, ranges)) != canon(store):
                    return False
    return True
