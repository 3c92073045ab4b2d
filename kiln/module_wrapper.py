"""What makes a compiled module behave like torch's ``OptimizedModule`` (issue 27).

``kiln.compile(m)`` returns a wrapper that holds ``m`` as ``_orig_mod`` (so its
``state_dict`` keys are ``_orig_mod.*``, as torch.compile's are). The wrapper is otherwise
transparent:

- attribute reads fall through to ``m`` (``__getattr__``) and writes and deletes go to ``m``
  (``compiled.scale = 3`` sets ``m.scale``). The compiled forward reads ``m``'s attributes
  through its guards, so a write is seen by the next call (a recompile, or an int that became
  dynamic), never hidden on the wrapper;
- ``training`` is ``m``'s flag (``compiled.eval()`` and ``compiled.training = False`` agree);
- ``copy.copy``/``copy.deepcopy``/``pickle``/``torch.save`` rebuild the wrapper from ``m`` and
  the compile options: a compiled function holds code objects, caches and locks, none of which
  can or should be copied, so the copy compiles afresh on its first call. A deep copy
  deep-copies ``m`` (its parameters are its own); a shallow copy shares ``m``.
"""
from __future__ import annotations


def _rebuild(cls, mod, opts):
    return cls(mod, **opts)


class ModuleWrapper:
    """Mixin for ``torch.nn.Module`` subclasses that hold the wrapped module as ``_orig_mod``
    and their compile options as ``_kiln_opts``. Attributes named in ``wrapper_attributes``
    (and the class's own attributes: methods, properties) stay on the wrapper."""

    wrapper_attributes = frozenset({"_orig_mod", "_compiled_forward", "_kiln_opts", "__dict__",
                                    "_forward_class", "_other_forwards"})

    def _wrapped(self):
        # not through __getattr__: during nn.Module.__init__ there is no _modules yet
        return self.__dict__.get("_modules", {}).get("_orig_mod")

    def __setattr__(self, name, value):
        mod = self._wrapped()
        if mod is None or name in type(self).wrapper_attributes or hasattr(type(self), name):
            return super().__setattr__(name, value)
        setattr(mod, name, value)

    def __delattr__(self, name):
        mod = self._wrapped()
        if mod is None or name in type(self).wrapper_attributes or hasattr(type(self), name):
            return super().__delattr__(name)
        delattr(mod, name)

    @property
    def training(self) -> bool:
        mod = self._wrapped()
        return True if mod is None else mod.training

    @training.setter
    def training(self, value: bool):
        # nn.Module.__init__ sets training=True before _orig_mod exists: nothing to mirror yet
        mod = self._wrapped()
        if mod is not None:
            mod.training = value

    def __reduce__(self):
        return _rebuild, (type(self), self._modules["_orig_mod"], dict(self._kiln_opts))

    def __deepcopy__(self, memo):
        # defined here, not left to copy's getattr: __getattr__ would hand back the wrapped
        # module's own __deepcopy__ (if it has one), and the copy would not be compiled
        import copy
        out = _rebuild(type(self), copy.deepcopy(self._modules["_orig_mod"], memo),
                       copy.deepcopy(dict(self._kiln_opts), memo))
        memo[id(self)] = out
        return out

    def __len__(self):
        # special methods are looked up on the class, not through __getattr__: proxied as
        # torch's OptimizedModule proxies it (a compiled nn.Sequential has a length)
        mod = self._modules["_orig_mod"]
        if not hasattr(type(mod), "__len__"):
            raise TypeError(f"{type(mod).__name__} does not support len()")
        return len(mod)

    def __bool__(self):
        # without it, truth would call __len__ and raise for most modules (torch's wrapper
        # does: ``if compiled:`` raises there); a module is true unless its own len() is 0
        mod = self._modules["_orig_mod"]
        return bool(mod)

    def __dir__(self):
        own = self._modules["_orig_mod"].__dir__()
        return own + [a for a in super().__dir__() if a not in own]

