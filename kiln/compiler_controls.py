"""What ``torch.compiler``'s process-wide controls do to kiln's compiled functions (issue 27).

- ``torch.compiler.set_stance(...)`` (read in capture/controls.py), on a call of a compiled
  function, as torch.compile's frames take it:
  - ``"force_eager"``: the function runs natively; nothing is looked up or compiled;
  - ``"eager_on_recompile"``: a call that a cached entry accepts runs it; any other call (a
    function never compiled included, as torch's "run only" callback does) runs natively,
    counted as an eager run (kiln/eager_runs.py), never compiled;
  - ``"fail_on_recompile"``: a call no cached entry accepts raises RuntimeError (also the
    first compile, as torch's does), naming the function and why the entries missed;
  - ``"eager_then_compile"`` / ``"aot_eager_then_compile"``: the first call of a function
    runs natively and records its tensor arguments' sizes; the next miss compiles, with the
    sizes that differ between the two calls dynamic from the start. (kiln runs the first call
    eagerly in both: an aot_eager first run is torch's memory saving, not a result.)
  - ``"default"``: as if no stance was set. ``force_backend`` and ``skip_guard_eval_unsafe``
    are not read: kiln's backends are chosen per compile, and it always checks guards.
- ``torch.compiler.reset()`` resets kiln too. torch offers no hook for it, so importing kiln
  wraps the public function once (``install_reset_hook``): the wrapper calls torch's own
  reset, then ``kiln.reset()``; torch's is kept as ``__wrapped__``. ``torch._dynamo.reset()``
  (Dynamo's own, which the public one calls) is left alone.
"""
from __future__ import annotations

import functools

import torch

from kiln import log
from kiln.eager_runs import note_eager_run

COMPILE = object()  # miss_under_stance: compile as usual


def miss_under_stance(cf, stance: str, cache, L, args, kwargs, grad):
    """A call of ``cf`` that no cached entry accepted, under a non-default stance: the call's
    result, or ``COMPILE``."""
    if stance == "force_eager":
        return cf.fn(*args, **kwargs)
    if stance == "eager_on_recompile":
        note_eager_run("torch.compiler.set_stance('eager_on_recompile'): no compiled entry "
                       "accepts this call, and the stance forbids compiling", cf.code)
        return cf.fn(*args, **kwargs)
    if stance == "fail_on_recompile":
        why = cf._why_miss(cache, L, grad) if cache.entries else "nothing compiled yet"
        raise RuntimeError(f"Detected recompile when torch.compile stance is 'fail_on_recompile': "
                           f"kiln would compile {cf.name} ({cf.code.co_filename}:"
                           f"{cf.code.co_firstlineno}); triggered by: {why}")
    if stance in ("eager_then_compile", "aot_eager_then_compile") and not cache.entries:
        sizes = _tensor_sizes(L)
        if cache.first_sizes is None:
            cache.first_sizes = sizes
            log.log("recompiles", "%s: stance %r runs its first call eagerly", cf.name, stance)
            return cf.fn(*args, **kwargs)
        if cf.dynamic is None:  # the sizes that moved between the two calls: dynamic at once
            for src, shape in sizes.items():
                was = cache.first_sizes.get(src)
                if was is not None and len(was) == len(shape):
                    changed = {d for d, (a, b) in enumerate(zip(was, shape)) if a != b}
                    if changed:
                        cache.auto_dynamic.setdefault(src, set()).update(changed)
    return COMPILE


def _tensor_sizes(L) -> dict:
    """``{"L['x']": shape}`` for the call's tensor arguments (the sources capture names them by)."""
    return {f"L[{name!r}]": tuple(v.shape) for name, v in L.items()
            if isinstance(name, str) and isinstance(v, torch.Tensor)}


def install_reset_hook(kiln_reset):
    current = torch.compiler.reset
    if getattr(current, "_kiln_resets", False):
        return  # installed already (kiln imported again, or reloaded)

    @functools.wraps(current)
    def reset() -> None:
        current()
        kiln_reset()
    reset._kiln_resets = True
    torch.compiler.reset = reset
