"""A workaround for a sympy bug in ``Mod`` that silently corrupts index expressions.

sympy 1.14's ``Mod.eval`` squares the ``Mod`` factors of an integer product whose modulus
differs from the outer one (sympy issue #28744, fixed upstream by PR #28759)::

    >>> i = Symbol("i", integer=True, nonnegative=True)
    >>> Mod(2*Mod(i, 3), 5)
    Mod(2*Mod(i, 3)**2, 5)          # should be Mod(2*Mod(i, 3), 5)

Kiln builds such products whenever views compose: a pad's or cat's operand index is
``Mod(i - lo, size)`` (``lowering_views._index_in``) and ``i`` may itself be a strided index of
an unravelled reshape (``2*Mod(q, 3) + 1``), so max_pool2d's backward, once its window
gradients were inlined rather than realized, loaded ``x`` at ``Mod(2*Mod(q, 3)**2, 5)``. Every
rebuild of an expression (``xreplace``, ``expand``, ``simplify_index``) re-evaluates ``Mod``,
so the fix has to live in ``Mod`` itself.

``install()`` (run when kiln's index math is imported) wraps ``Mod.eval`` only if the installed
sympy has the bug: for exactly the arguments that reach the faulty step, each ``Mod`` factor
is hidden behind a dummy symbol with the same sign assumptions while sympy evaluates, then put
back. The result is correct, at worst less simplified than a fixed sympy's.
"""
from __future__ import annotations

import sympy
from sympy import Mod, Mul, S

_installed = False


def _has_bug() -> bool:
    i = sympy.Dummy("i", integer=True, nonnegative=True)
    return Mod(2 * Mod(i, 3), 5).has(sympy.Pow)


def _reaches_faulty_step(p, q) -> bool:
    """The arguments for which sympy 1.14's Mul branch multiplies the Mod factors in twice."""
    if not isinstance(p, Mul) or not q.is_Integer or q is S.One:
        return False
    mods = [a for a in p.args if isinstance(a, Mod)]
    if not mods or not all(t.is_integer for t in p.args):
        return False
    # sympy's first case (every inner modulus is q) returns before the faulty step, correctly
    return not all(m.args[1] == q for m in mods)


def _restore(expr, back: dict):
    """``expr.xreplace(back)``, except that a rebuilt Mod is not evaluated again (it was, with
    its Mod factors hidden; evaluating it again would come straight back here)."""
    if expr in back:
        return back[expr]
    if not expr.args:
        return expr
    args = [_restore(a, back) for a in expr.args]
    if all(a is b for a, b in zip(args, expr.args)):
        return expr
    if isinstance(expr, Mod):
        return Mod(*args, evaluate=False)
    return expr.func(*args)


def install() -> None:
    global _installed
    if _installed or not _has_bug():
        _installed = True
        return
    original = Mod.eval.__func__

    def eval(cls, p, q):
        if not _reaches_faulty_step(p, q):
            return original(cls, p, q)
        hidden = {}
        factors = []
        for a in p.args:
            if isinstance(a, Mod):
                if a not in hidden:
                    signs = {k: True for k in ("nonnegative", "nonpositive") if getattr(a, f"is_{k}")}
                    hidden[a] = sympy.Dummy(integer=True, **signs)
                factors.append(hidden[a])
            else:
                factors.append(a)
        rv = original(cls, Mul(*factors), q)
        return None if rv is None else _restore(rv, {d: m for m, d in hidden.items()})

    Mod.eval = classmethod(eval)
    sympy.core.cache.clear_cache()
    _installed = True


install()
