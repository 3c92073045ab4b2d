"""2D tiled Triton pointwise kernels: a transpose coalesced on both sides.

A pointwise kernel that stores along its innermost dim ``x`` but loads some input whose
contiguous dim is another dim ``y`` (``x.t().contiguous()``, ``a + b.transpose(1, 2)``) reads
that input one element per 32-byte sector when the block is one-dimensional along ``x``. Over a
``[YBLOCK, XBLOCK]`` tile, ``y`` and ``x`` are both block axes: Triton lays the tile out so the
store is contiguous along ``x`` and the load along ``y``, converting between the two through
shared memory. Each program takes one tile; the kernel's other dims are scalars per program.

``tile_plan`` picks the two dims (or None: symbolic sizes, small kernels, index math with
division or modulo, stores not contiguous along the last dim, no transposed load);
``tiled_index_lines`` writes the program-to-tile mapping. ``config.triton_tile_2d`` switches it
(``config.triton_tile_2d``).
"""
from __future__ import annotations

import math

import sympy

from kiln.inductor import ir

TILE_MIN = 1 << 14  # elements: smaller kernels are launch-bound either way
MIN_SIDE = 16       # both tiled dims at least this long


def _linear(index) -> bool:
    return not index.has(sympy.Mod, sympy.floor)


def tile_plan(kernel, shape, ranges) -> tuple[int, int] | None:
    """(ydim, xdim) to tile over, or None."""
    n = len(shape)
    if n < 2 or any(isinstance(s, sympy.Basic) and s.free_symbols for s in shape):
        return None
    if math.prod(shape) < TILE_MIN or shape[n - 1] < MIN_SIDE:
        return None
    syms = ir.index_symbols(n)
    xs = syms[n - 1]
    for node in kernel.nodes:
        if node.name in kernel.stores:
            idx = sympy.expand(ir.simplify_index(kernel.store_index(node), ranges))
            if not _linear(idx) or idx.coeff(xs, 1) != 1:
                return None
    ydim = None
    for node in kernel.nodes:
        for ld in ir.loads_of(kernel.body(node)):
            idx = sympy.expand(ir.simplify_index(ld.index, ranges))
            if not idx.free_symbols & set(syms):
                continue
            if not _linear(idx):
                return None
            if idx.coeff(xs, 1) in (0, 1):
                continue  # contiguous along x already, or constant along it (a broadcast)
            for d in range(n - 1):
                if idx.coeff(syms[d], 1) == 1 and shape[d] >= MIN_SIDE:
                    ydim = d if ydim is None else ydim
    return None if ydim is None else (ydim, n - 1)


def is_transposed_load(index, plan, ranges) -> bool:
    """Is a load contiguous along the plan's y dim (and not along, or constant in, x)? The
    C++ tiles copy such an input through a local array (codegen/cpp.py _tiled_loops)."""
    ydim, xdim = plan
    idx = sympy.expand(ir.simplify_index(index, ranges))
    syms = ir.index_symbols(len(ranges))
    if not idx.free_symbols <= set(syms) or not _linear(idx):
        return False
    return idx.coeff(syms[ydim], 1) == 1 and idx.coeff(syms[xdim], 1) not in (0, 1)


def tile_blocks(shape, plan) -> tuple[int, int, int]:
    """(YBLOCK, XBLOCK, num_warps)."""
    ydim, xdim = plan

    def side(s):
        return min(64, 1 << max(4, (s - 1).bit_length()))
    return side(shape[ydim]), side(shape[xdim]), 4


def tile_grid(shape, plan, yblock, xblock) -> int:
    ydim, xdim = plan
    rest = math.prod(s for d, s in enumerate(shape) if d not in plan)
    return -(-shape[xdim] // xblock) * -(-shape[ydim] // yblock) * rest


def tiled_index_lines(shape, plan, pid: str) -> list[str]:
    """The index symbols of one tile: ``i{x}`` a [1, XBLOCK] row, ``i{y}`` a [YBLOCK, 1] column,
    every other dim a scalar of the program id; ``xmask`` is the tile's [YBLOCK, XBLOCK] mask."""
    ydim, xdim = plan
    lines = [f"pid = {pid}",
             f"nx = tl.cdiv({shape[xdim]}, XBLOCK)",
             f"ny = tl.cdiv({shape[ydim]}, YBLOCK)",
             f"i{xdim} = (pid % nx) * XBLOCK + tl.arange(0, XBLOCK)[None, :]",
             f"i{ydim} = ((pid // nx) % ny) * YBLOCK + tl.arange(0, YBLOCK)[:, None]",
             f"xmask = (i{xdim} < {shape[xdim]}) & (i{ydim} < {shape[ydim]})",
             "rest = pid // (nx * ny)"]
    inner = 1
    for d in range(len(shape) - 1, -1, -1):
        if d in plan:
            continue
        lines.append(f"i{d} = (rest // {inner}) % {shape[d]}" if inner > 1 else f"i{d} = rest % {shape[d]}")
        inner *= shape[d]
    return lines
