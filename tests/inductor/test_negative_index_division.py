"""Index arithmetic with a dividend that can be negative (issue 24, peer ``test_flip_cat``).

sympy keeps a flip's row index ``floor((n - 1 - i0) / w)`` as ``floor(-i0 / w) + c``, and its
modulo as ``Mod(-i0 + c, w)``. C's and Triton's integer ``/`` and ``%`` truncate toward zero,
sympy's round down, so printing them as-is read the wrong element where ``-i0`` is not a
multiple of ``w``: ``cat([a, b], 1).view(4)[:3].flip(0)`` gave a wrong middle element. The
index printer now spells floor division and modulo of a dividend that may be negative so that
they round down (``codegen/common.py IndexPrinter``).
"""
from __future__ import annotations

import pytest
import sympy
import torch

import kiln
from kiln.inductor import ir
from kiln.inductor.codegen.common import IndexPrinter
from testing import TARGETS, on_target


def _flip_cat(a, b):
    return (torch.cat([a, b], 1).view(-1)[: a.shape[0] * 2 - 1].flip(0),)


def _flip_cat_2d(a, b):
    c = torch.cat([a, b], 1)  # (n, wa + wb)
    return (c.reshape(-1)[1:].flip(0) * 2, c.flip(0, 1)[:, 1:].reshape(-1))


def _flip_of_transposed_slice(x):
    return (x.t()[1:].flip(0).reshape(-1) + 1,)


def _roll_of_flip(x):
    return (x.flip(1).roll(3, 1).reshape(-1)[2:].flip(0),)


CASES = [
    (_flip_cat, lambda: (torch.randn(2, 1), torch.randn(2, 1))),
    (_flip_cat, lambda: (torch.randn(5, 1), torch.randn(5, 1))),
    (_flip_cat_2d, lambda: (torch.randn(3, 2), torch.randn(3, 3))),
    (_flip_cat_2d, lambda: (torch.randn(5, 4).t()[:, :3], torch.randn(4, 2))),  # non-contiguous
    (_flip_of_transposed_slice, lambda: (torch.randn(7, 5),)),
    (_flip_of_transposed_slice, lambda: (torch.randn(6, 9)[:, ::2],)),
    (_roll_of_flip, lambda: (torch.randn(3, 7),)),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_views_of_flips_and_cats_match_eager(case, target):
    fn, make = CASES[case]
    with on_target(target) as device, kiln.config.patch(strict=True):
        args = [x.to(device) for x in make()]
        got, want = kiln.compile(fn)(*args), fn(*args)
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.equal(g.cpu(), w.cpu()), (g, w)
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("floordiv", ["/", "//"])
def test_printed_floor_and_mod_round_down_for_negative_dividends(floordiv):
    """Evaluate the printed text with truncating division (C's and Triton's) for every i0."""
    i0 = ir.index_symbol(0)
    printer = IndexPrinter(floordiv)
    exprs = [sympy.floor((5 - i0) / 3), sympy.Mod(4 - i0, 3), sympy.floor(-i0 / 2) + 1,
             sympy.Mod(sympy.floor(-i0 / 2) + 1, 2), sympy.floor(i0 / 4)]
    for expr in exprs:
        text = printer.doprint(expr)
        c_text = text.replace("//", "/")
        for v in range(0, 12):
            got = _eval_truncating(c_text, v)
            assert got == int(expr.subs(i0, v)), (expr, text, v)
    # a dividend known non-negative keeps the plain spelling
    assert printer.doprint(sympy.floor(i0 / 4)) == f"((i0) {floordiv} (4))"


def _eval_truncating(text: str, i0: int) -> int:
    """The C semantics of ``/`` and ``%`` on ints: both truncate toward zero."""
    class T(int):
        def __truediv__(a, b):
            q = abs(int(a)) // abs(int(b))
            return T(q if (a >= 0) == (b >= 0) else -q)

        def __mod__(a, b):
            return T(int(a) - int(b) * int(T(a).__truediv__(b)))

        def _wrap(op):
            return lambda a, b: T(op(int(a), int(b)))
        __add__ = __radd__ = _wrap(int.__add__)
        __sub__ = _wrap(int.__sub__)
        __rsub__ = _wrap(lambda a, b: b - a)
        __mul__ = __rmul__ = _wrap(int.__mul__)
        __neg__ = lambda a: T(-int(a))  # noqa: E731

    import re
    wrapped = re.sub(r"\b(\d+)\b", r"T(\1)", text)
    return int(eval(wrapped, {"T": T, "i0": T(i0)}))  # noqa: S307
