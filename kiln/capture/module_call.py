"""A submodule called inside a traced frame: ``m(*args)`` as ``nn.Module._call_impl`` runs it.

The forward pre-hooks and forward hooks (the module's own, with or without kwargs, and the
global ones of ``torch.nn.modules.module``) are Python functions: they are inlined around the
inlined forward, in ``_call_impl``'s order. A pre-hook's result replaces the arguments (a
non-tuple becomes a 1-tuple; a with_kwargs hook returns ``(args, kwargs)``), a forward hook's
result replaces the output, and ``None`` keeps them. ``always_call`` only matters when forward
raises, which a trace never completes, so it needs nothing here.

Guards: the hook tables' structure (how many hooks, which take kwargs), not their ids, so
twelve blocks each carrying the same hook share one entry; each hook is wrapped through its
position in the table (``list(d.values())[i]``) and guarded like any function.

Not traced (a graph break at the call, ``compile_callee`` set): backward hooks, and modules
sharded by FSDP2 (``fully_shard``), whose hooks all-gather and free parameters with
collectives. At such a break the glue runs the module's hooks for real around its compiled
forward (kiln/breaks.py ``_callee_wrapper``), so the forward still runs as kiln's kernels.
"""
from __future__ import annotations

import sys
import types

from kiln.capture.controls import compiled_original
from kiln.capture.errors import Unsupported
from kiln.capture.guards import AttrSource, ExprSource, ModuleSource
from kiln.capture.values_stdlib import DictValueAtSource
from kiln.capture.values import ConstantVariable, DictVariable, TupleVariable
from kiln.capture.values_callables import FunctionVariable

GLOBALS = "torch.nn.modules.module"  # where nn.Module keeps the global hook tables
_NO_GLOBAL_HOOKS = ("not ({}._global_forward_hooks or {}._global_forward_pre_hooks or "
                    "{}._global_backward_hooks or {}._global_backward_pre_hooks)")
_NO_HOOKS = "not ({}._forward_hooks or {}._forward_pre_hooks or {}._backward_hooks or {}._backward_pre_hooks)"


def hooks_unsupported(module, reason: str) -> Unsupported:
    """A break at the call of a module whose hooks stay out of the graph; the glue calls the
    module for real, hooks included, around its compiled forward."""
    err = Unsupported(f"calling {type(module).__name__}: {reason}; the module call runs outside "
                      "the graph (its hooks as Python, its forward compiled on its own)")
    err.compile_callee = True
    return err


def _is_fsdp2(module) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(fsdp, "FSDPModule", None) if fsdp is not None else None
    return cls is not None and isinstance(module, cls)


def call_module(tx, mv, args, kwargs):
    """Trace ``mv.module(*args, **kwargs)``: hooks and forward inlined (see the module docstring)."""
    from torch.nn.modules import module as nn_module

    m = mv.module
    if _is_fsdp2(m):
        raise hooks_unsupported(m, "it is sharded by FSDP2 (fully_shard), whose hooks all-gather "
                                "and reshard its parameters with collectives")
    if m._backward_hooks or m._backward_pre_hooks or nn_module._global_backward_hooks or \
            nn_module._global_backward_pre_hooks:
        raise hooks_unsupported(m, "backward hooks are registered on it (or globally), and kiln "
                                "does not trace backward hooks")
    if _is_compiled_module(m):  # kiln.compile(layer) inside a compiled root: the layer itself
        return _call_compiled_module(tx, mv, args, kwargs)
    g = ExprSource(GLOBALS)
    if mv.local:  # made in this trace (module_new.py): its own hook tables are known now
        if m._forward_hooks or m._forward_pre_hooks:
            raise Unsupported(f"calling a {type(m).__name__} module made inside compiled code "
                              "with forward hooks registered on it")
    if not (m._forward_hooks or m._forward_pre_hooks or nn_module._global_forward_hooks or
            nn_module._global_forward_pre_hooks):  # the common case: forward alone
        tx.guards.add(g, _NO_GLOBAL_HOOKS)
        if not mv.local:
            tx.guards.add(mv.source, _NO_HOOKS)
        return _forward(tx, mv).call(tx, args, kwargs)
    tx.guards.add(g, "not ({}._global_backward_hooks or {}._global_backward_pre_hooks)")
    if mv.local:  # no hooks of its own (checked above): only the global ones run
        return _call_with_hooks(tx, mv, list(args), dict(kwargs), *_global_hooks(tx, nn_module))
    tx.guards.add(mv.source, "not ({}._backward_hooks or {}._backward_pre_hooks)")
    pre, post = _global_hooks(tx, nn_module)
    pre = pre + _hook_table(tx, m._forward_pre_hooks, AttrSource(mv.source, "_forward_pre_hooks"),
                            m._forward_pre_hooks_with_kwargs,
                            AttrSource(mv.source, "_forward_pre_hooks_with_kwargs"))
    post = post + _hook_table(tx, m._forward_hooks, AttrSource(mv.source, "_forward_hooks"),
                              m._forward_hooks_with_kwargs, AttrSource(mv.source, "_forward_hooks_with_kwargs"))
    return _call_with_hooks(tx, mv, list(args), dict(kwargs), pre, post)


# kiln.compile's module wrapper (api.CompiledModule): the api sits above capture, so
# kiln/__init__.py hands it down.
COMPILED_MODULE: type = type(None)


def _is_compiled_module(module) -> bool:
    """A ``kiln.compile``-d module whose forward is the original's compiled (not CompiledDDP)."""
    cls = COMPILED_MODULE
    return isinstance(module, cls) and type(module).forward is cls.forward


def _call_compiled_module(tx, mv, args, kwargs):
    """A compiled module called inside a trace is its original module called (hooks included,
    as ``CompiledModule.__call__`` runs them), traced into this graph. Hooks on the wrapper
    itself run once more around that, with the global ones: rare, so a break."""
    m = mv.module
    if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
        raise hooks_unsupported(m, "hooks are registered on the kiln.compile wrapper itself")
    tx.guards.add(mv.source, _NO_HOOKS)
    return mv.getattr(tx, "_orig_mod").call(tx, args, kwargs)


def _global_hooks(tx, nn_module):
    """(pre, post): the global forward hook tables as ``_hook_table`` reads them. A hook's
    source must load anywhere (a side effect's replay, a break's glue): the global tables are
    read through sys.modules, not through the guards' ``torch`` name."""
    gm = ModuleSource(GLOBALS)
    pre = _hook_table(tx, nn_module._global_forward_pre_hooks,
                      AttrSource(gm, "_global_forward_pre_hooks"), None, None)
    post = _hook_table(tx, nn_module._global_forward_hooks, AttrSource(gm, "_global_forward_hooks"),
                       nn_module._global_forward_hooks_with_kwargs,
                       AttrSource(gm, "_global_forward_hooks_with_kwargs"))
    return pre, post


def _hook_table(tx, table, source, kw_table, kw_source) -> list:
    """``[(hook tracker, takes kwargs)]`` of the hook table ``table`` (read at ``source``),
    guarded by its length and, per position, whether the hook takes kwargs (``kw_table`` holds
    the ids of those that do). Ids differ per module, so they are not guarded."""
    tx.guards.add(source, f"len({{}}) == {len(table)}" if table else "not {}")
    if not table:
        return []
    flags = [kw_table is not None and hook_id in kw_table for hook_id in table]
    if kw_source is not None:
        tx.guards.add(source, f"list(map({kw_source.expr()}.__contains__, {{}})) == {flags!r}")
    return [(tx.wrap(hook, DictValueAtSource(source, i)), flags[i])
            for i, hook in enumerate(table.values())]


def _is_none(v) -> bool:
    return isinstance(v, ConstantVariable) and v.value is None


def _call_with_hooks(tx, mv, args: list, kwargs: dict, pre: list, post: list):
    """``_call_impl``'s forward path on trackers: pre-hooks, forward, forward hooks."""
    # one kwargs dict for the whole call, as in _call_impl: a hook that writes into it in
    # place changes what forward (and the later hooks) get
    kw = DictVariable(kwargs)
    for hook, with_kwargs in pre:
        if with_kwargs:
            out = hook.call(tx, [mv, TupleVariable(args), kw], {})
            if _is_none(out):
                continue
            if not (isinstance(out, TupleVariable) and len(out.items) == 2):
                raise Unsupported(f"a forward pre-hook of {type(mv.module).__name__} (with_kwargs) "
                                  f"returned {out}, not None or (args, kwargs)")
            new_args, kw = out.items
            if not isinstance(kw, DictVariable):
                raise Unsupported(f"a forward pre-hook of {type(mv.module).__name__} returned "
                                  f"kwargs {kw}, not a dict")
            args = list(new_args.iterate(tx))
        else:
            out = hook.call(tx, [mv, TupleVariable(args)], {})
            if not _is_none(out):  # a tuple (or a tuple subclass) is the arguments; else (out,)
                args = list(out.iterate(tx)) if _is_tuple(out) else [out]
    result = _forward(tx, mv).call(tx, args, _str_keys(mv, kw))
    for hook, with_kwargs in post:
        hook_args = [mv, TupleVariable(args)] + ([kw] if with_kwargs else []) + [result]
        out = hook.call(tx, hook_args, {})
        if not _is_none(out):
            result = out
    return result


def _is_tuple(v) -> bool:
    if isinstance(v, TupleVariable):
        return True
    try:
        return issubclass(v.python_type(), tuple)
    except Unsupported:
        return False


def _str_keys(mv, kw) -> dict:
    items = dict(kw.items)
    if not all(isinstance(k, str) for k in items):
        raise Unsupported(f"keyword arguments of {type(mv.module).__name__} with non-str keys")
    return items


def _forward(tx, mv):
    """The module's forward as a tracker, guarded to stay the same function."""
    m = mv.module
    forward = m.forward
    if not (isinstance(forward, types.MethodType) and forward.__self__ is m):
        raise Unsupported(f"{type(m).__name__}.forward is not a method")
    # modules are guarded by type (tracer._wrap_module): another instance of the class may
    # carry a forward of its own (accelerate's hooks set ``module.forward``)
    if mv.local:
        pass  # made in this trace: the forward it holds is the one every call of it has
    elif "forward" in m.__dict__:
        tx.guards.identity(tx.attr_source(tx.attr_source(mv.source, "forward"), "__func__"),
                           forward.__func__)
    else:
        tx.guards.add(mv.source, "'forward' not in {}.__dict__")
    # sourced as ``m.forward.__func__``: what its closure holds is then reachable and guarded
    # (a class decorator's wrapper forward, as the ``kernels`` package's use_kernelized_func,
    # iterates modules held in its closure)
    source = None if mv.local or mv.source is None else AttrSource(AttrSource(mv.source, "forward"), "__func__")
    func = forward.__func__
    original = compiled_original(func)
    if original is not None:  # a class whose forward kiln.compile'd (``@kiln.compile`` on it)
        func, source = original, source and AttrSource(source, "fn")
    return FunctionVariable(func, self_var=mv, source=source)
