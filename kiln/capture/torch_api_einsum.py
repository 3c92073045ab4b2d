"""Capture-table entry for torch.einsum (merged into torch_api's tables through torch_api_nn).

The equation is normalized for ``core.einsum`` (``kiln/ops/core_einsum.py``): spaces dropped,
``...`` replaced by fresh letters (right-aligned, as eager broadcasts them), an implicit output
made explicit (the ellipsis letters, then the letters used once, in ASCII order), and three or
more operands contracted left to right, each step keeping the letters a later operand or the
output still needs. A repeated letter in one operand (a diagonal or trace) and the sublist form
stay whole as a fallback node when no gradient is needed, and are graph breaks otherwise.
"""
from __future__ import annotations

import collections
import string

import torch

from kiln.capture.errors import Unsupported
from kiln.graph import Proxy
from kiln.graph.node import flatten_args
from kiln.ops import core
from kiln.ops import autocast as policy_table


def normalize(equation: str, ndims) -> tuple[list[str], str]:
    """(subscripts per operand, output subscripts), letters only."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    subs = lhs.split(",")
    if len(subs) != len(ndims):
        raise RuntimeError(f"einsum(): {len(subs)} subscripts in {equation!r} but {len(ndims)} operands")
    fresh = [c for c in string.ascii_letters if c not in eq]
    ell = max([n - (len(s) - 3) for s, n in zip(subs, ndims) if "..." in s] or [0])
    ell_letters = "".join(fresh[:ell])
    named = []
    for s, n in zip(subs, ndims):
        if "..." in s:
            k = n - (len(s) - 3)
            if k < 0:
                raise RuntimeError(f"einsum(): subscripts {s!r} name more dims than the operand's {n}")
            named.append(s.replace("...", ell_letters[ell - k:]))
        else:
            named.append(s)
        if len(named[-1]) != n:
            raise RuntimeError(f"einsum(): the number of subscripts in {s!r} does not match the number "
                               f"of dimensions ({n}) of its operand")
    if arrow:
        out = out.replace("...", ell_letters)
    else:
        counts = collections.Counter("".join(s.replace("...", "") for s in subs))
        out = ell_letters + "".join(sorted(c for c, k in counts.items() if k == 1))
    if not set(out) <= set("".join(named)):
        raise RuntimeError(f"einsum(): output subscripts of {equation!r} do not appear in the operands")
    if not all(s.isalpha() or not s for s in named + [out]):
        raise Unsupported(f"einsum({equation!r}): subscripts other than letters and '...'")
    return named, out


def _whole(equation, operands, why):
    if torch.is_grad_enabled() and any(o.meta.requires_grad for o in operands):
        raise Unsupported(f"einsum({equation!r}): {why}; a fallback node cannot give the gradient")
    return core.fallback("torch.einsum", equation, *operands)


def _autocast_composite(operand) -> bool:
    """Under an autocast whose policy does not name einsum (CPU), torch autocasts only the bmm
    inside its composite, depending on the pattern: such a call is left to eager torch."""
    device = operand.device.type
    if device not in policy_table.DEVICE_TYPES or policy_table.policy(device, "einsum") is not None:
        return False
    state = getattr(getattr(operand.graph_builder, "call_hook", None), "__self__", None)
    return state is not None and hasattr(state, "current") and state.current(device)[0]


def einsum(equation, *operands):
    if not isinstance(equation, str):
        raise Unsupported("einsum in the sublist form is not supported")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands or not all(isinstance(o, Proxy) for o in flatten_args(operands)):
        raise Unsupported("einsum expects tensor operands")
    if _autocast_composite(operands[0]):
        raise Unsupported("torch.einsum under torch.autocast on a device whose policy leaves it "
                          "composite: eager autocasts the ops inside it")
    subs, out = normalize(equation, [o.ndim for o in operands])
    if any(len(set(s)) != len(s) for s in subs) or len(set(out)) != len(out):
        return _whole(equation, operands, "a repeated letter (diagonal or trace)")
    if len({o.dtype for o in operands}) != 1:
        return _whole(equation, operands, "operands of different dtypes")
    cur, cur_s = operands[0], subs[0]
    if len(operands) == 1:
        return core.einsum(f"{cur_s}->{out}", cur)
    for k in range(1, len(operands)):
        if k == len(operands) - 1:
            keep = out
        else:
            later = set(out).union(*(set(s) for s in subs[k + 1:]))
            keep = "".join(dict.fromkeys(c for c in cur_s + subs[k] if c in later))
        cur = core.einsum(f"{cur_s},{subs[k]}->{keep}", cur, operands[k])
        cur_s = keep
    return cur


FUNCTIONS = {torch.einsum: einsum}
