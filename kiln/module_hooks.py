"""The hooks of a compiled module, run around its compiled forward (issue 24, item 2).

``kiln.compile(m)`` compiles ``m.forward``; a call of the compiled module must still do what
``m(...)`` does around ``forward``: forward pre-hooks (module ones, with or without kwargs, and
the global ones of ``torch.nn.modules.module``), forward hooks (``with_kwargs``,
``always_call``), and backward hooks. The hooks run here, as Python, around the compiled
forward; they are read on every call (a few dict truth tests), so a hook added after compiling
takes effect at the next call.
"""
from __future__ import annotations

import types

import torch
from torch.nn.modules import module as _nn

def _global(name: str) -> dict:
    return getattr(_nn, name, None) or {}


def has_hooks(mod, include_global: bool) -> bool:
    """Any hook ``mod(...)`` would run: the fast path skips all of this when False."""
    if mod._forward_pre_hooks or mod._forward_hooks or mod._backward_hooks or \
            getattr(mod, "_backward_pre_hooks", None):
        return True
    return include_global and (_nn._global_forward_pre_hooks or _nn._global_forward_hooks or
                               _nn._global_backward_hooks or _nn._global_backward_pre_hooks)


def _pre_hooks(mod, args, kwargs, include_global):
    with_kwargs = mod._forward_pre_hooks_with_kwargs
    hooks = [*(_global("_global_forward_pre_hooks").items() if include_global else ()),
             *mod._forward_pre_hooks.items()]
    for hook_id, hook in hooks:
        if hook_id in with_kwargs:
            out = hook(mod, args, kwargs)
            if out is not None:
                if not (isinstance(out, tuple) and len(out) == 2):
                    raise RuntimeError("forward pre-hook must return None or a tuple of "
                                       f"(new_args, new_kwargs), but got {out}.")
                args, kwargs = out
        else:
            out = hook(mod, args)
            if out is not None:
                args = out if isinstance(out, tuple) else (out,)
    return args, kwargs


def _forward_hook_list(mod, include_global):
    """(hook_id, hook, with_kwargs, always_call), in the order ``nn.Module.__call__`` runs them."""
    out = []
    if include_global:
        g_kw = _global("_global_forward_hooks_with_kwargs")
        g_always = _global("_global_forward_hooks_always_called")
        out += [(i, h, i in g_kw, i in g_always) for i, h in _global("_global_forward_hooks").items()]
    kw, always = mod._forward_hooks_with_kwargs, mod._forward_hooks_always_called
    out += [(i, h, i in kw, i in always) for i, h in mod._forward_hooks.items()]
    return out


def _run_forward_hook(mod, hook, with_kwargs, args, kwargs, result):
    out = hook(mod, args, kwargs, result) if with_kwargs else hook(mod, args, result)
    return result if out is None else out


def call_with_hooks(mod, forward, args, kwargs, include_global=True):
    """``mod(*args, **kwargs)`` with ``forward`` (the compiled one) in place of ``mod.forward``."""
    ran_always: set = set()
    result = None
    try:
        args, kwargs = _pre_hooks(mod, args, kwargs, include_global)
        bw_hook, plain_bw = _backward_setup(mod, include_global)
        if bw_hook is not None:
            args = bw_hook.setup_input_hook(args)
        result = forward(*args, **kwargs)
        for hook_id, hook, with_kwargs, always in _forward_hook_list(mod, include_global):
            if always:
                ran_always.add(hook_id)
            result = _run_forward_hook(mod, hook, with_kwargs, args, kwargs, result)
        if bw_hook is not None:
            result = bw_hook.setup_output_hook(result)
        if plain_bw:
            _register_plain_backward_hooks(mod, plain_bw, result)
        return result
    except Exception:
        # always_call hooks run even when forward (or an earlier hook) raised; an error of
        # theirs is a warning, and the first error is the one raised
        import warnings
        for hook_id, hook, with_kwargs, always in _forward_hook_list(mod, include_global):
            if always and hook_id not in ran_always:
                try:
                    result = _run_forward_hook(mod, hook, with_kwargs, args, kwargs, result)
                except Exception as e:  # noqa: BLE001 - silenced, as nn.Module does
                    warnings.warn("module forward hook with ``always_call=True`` raised an "
                                  f"exception that was silenced as another error was raised in "
                                  f"forward: {e}", stacklevel=2)
        raise


def _backward_setup(mod, include_global):
    """torch's BackwardHook for full backward (pre-)hooks, and the list of old-style ones."""
    has_pre = getattr(mod, "_backward_pre_hooks", None) or \
        (include_global and _global("_global_backward_pre_hooks"))
    has_bw = mod._backward_hooks or (include_global and _global("_global_backward_hooks"))
    if not (has_pre or has_bw):
        return None, []
    pre = mod._get_backward_pre_hooks() if has_pre else []
    full, plain = mod._get_backward_hooks() if has_bw else ([], [])
    if full or pre:
        from torch.utils.hooks import BackwardHook
        return BackwardHook(mod, full, pre), plain
    return None, plain


def _register_plain_backward_hooks(mod, hooks, result):
    """``register_backward_hook`` (not full): on the grad_fn of the first output tensor."""
    var = result
    while not isinstance(var, torch.Tensor):
        var = next(v for v in var.values() if isinstance(v, torch.Tensor)) if isinstance(var, dict) \
            else var[0]
    if var.grad_fn is not None:
        from torch.nn.modules.module import _WrappedHook
        for hook in hooks:
            var.grad_fn.register_hook(_WrappedHook(hook, mod))


class HookedForward:
    """A module's compiled forward that a graph break's glue calls as ``m(...)`` would be
    called: bound to the module at run time (``MethodType(self, m)``, see kiln/breaks.py), with
    the module's hooks (and the global ones) run around it as Python. The hooks are read on
    each call, so this is right whether or not they were traced (capture/module_call.py)."""

    def __init__(self, compiled):
        self.compiled = compiled

    def __call__(self, mod, *args, **kwargs):
        forward = types.MethodType(self.compiled, mod)
        if has_hooks(mod, True):
            return call_with_hooks(mod, forward, args, kwargs)
        return forward(*args, **kwargs)
