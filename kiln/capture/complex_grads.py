"""A core op that would drop the gradient of a complex operand is a graph break.

Complex values carry gradients between fallback nodes and views (``torch.fft.fftn(h).real``),
but core elementwise ops give complex results no gradient flag: their VJP rules are written
for real values (a complex product's rule needs the conjugate). ``(torch.fft.fft(h) * 2).real``
then lost h's gradient through the product without a word. Such a call breaks instead, so
eager's autograd runs it and the rest resumes compiled.
"""
from __future__ import annotations

from kiln.capture.errors import Unsupported
from kiln.graph import Proxy
from kiln.graph.node import flatten_args


def _needs_grad_complex(v) -> bool:
    return isinstance(v, Proxy) and v.meta.requires_grad and v.dtype.is_complex


def refuse_dropped_complex_grad(out, args, kwargs, name: str) -> None:
    """Unsupported where a complex operand needs a gradient and a result that could carry it
    does not (grad mode on: the caller checks)."""
    if not any(_needs_grad_complex(a) for a in flatten_args((args, kwargs))):
        return
    results = [o for o in flatten_args(out) if isinstance(o, Proxy)] if isinstance(out, (tuple, list)) \
        else [out] if isinstance(out, Proxy) else []
    for r in results:
        if (r.dtype.is_floating_point or r.dtype.is_complex) and not r.meta.requires_grad:
            raise Unsupported(f"{name}: the gradient of a complex operand would be dropped (core ops "
                              "have no complex gradient rules; eager's autograd runs this call)")
