"""The capture corpus: small functions and modules, each expected to capture without breaks
(except loop_breaks.py: graph breaks inside for loops, resumed inside the loop).

Every case is registered with ``@case(...)`` in one of the family modules (loops.py,
branches.py, ...) and run by ``test_corpus.py``: under ``backend="eager"`` and
``backend="kiln"``, compared with plain eager on fresh random inputs (and on the Python state
the case mutates), with its graph and break counts asserted through ``kiln.explain``.

A case is a function or an ``nn.Module`` class:

- ``inputs()`` returns the positional args (a tuple) or ``(args, kwargs)`` as a ``Call``;
- ``calls`` (optional) is a list of such input makers, called in order on one compiled object
  (to exercise guards and recompiles); ``compiles`` is then the expected number of compiles;
- ``state(obj)`` (optional) reads the Python state the case mutates, compared after every call;
- ``build()`` (optional) makes a fresh function or module (for cases with their own state).
"""
from __future__ import annotations

import dataclasses
import inspect

import torch

CASES: dict[str, "Case"] = {}


@dataclasses.dataclass
class Call:
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Case:
    name: str
    build: object                     # () -> fresh callable (function or module)
    calls: list                       # input makers, called in order
    graphs: int = 1
    breaks: int = 0
    compiles: int | None = None       # expected compiles over `calls` (default: graphs)
    state: object = None              # obj -> comparable Python state
    dtype: torch.dtype | None = None  # tolerance class of the outputs

    def make_call(self, i) -> Call:
        made = self.calls[i]()
        return made if isinstance(made, Call) else Call(tuple(made))


def case(inputs=None, *, calls=None, graphs=1, breaks=0, compiles=None, state=None, build=None,
         dtype=None, name=None):
    """Register a function or an nn.Module class as a corpus case."""
    def deco(obj):
        case_name = name or f"{obj.__module__.rsplit('.', 1)[-1]}.{obj.__name__}"
        if build is not None:
            builder = build
        elif inspect.isclass(obj):
            def builder(cls=obj):
                torch.manual_seed(0)  # the reference and the compiled copy get the same weights
                return cls()
        else:
            def builder(fn=obj):
                return fn
        makers = list(calls) if calls is not None else [inputs, inputs]
        assert case_name not in CASES, case_name
        CASES[case_name] = Case(case_name, builder, makers, graphs, breaks, compiles, state, dtype)
        return obj
    return deco


# ------------------------------------------------------------------ input makers
def rand(*shape, dtype=torch.float32, layout="contiguous"):
    if layout == "transposed" and len(shape) >= 2:
        return torch.randn(*shape[:-2], shape[-1], shape[-2]).to(dtype).transpose(-1, -2)
    return torch.randn(*shape).to(dtype)


def x48():
    return (rand(4, 8),)


def xy48():
    return (rand(4, 8), rand(4, 8))


def x48_t():
    """A non-contiguous input."""
    return (rand(4, 8, layout="transposed"),)


def xb():
    """A (4, 8) and a broadcast (8,) input."""
    return (rand(4, 8), rand(8))


FAMILIES = ("loops", "branches", "comprehensions", "functions", "builtins_consts",
            "tensor_attrs", "indexing", "classes", "outputs", "misc", "mutation", "loop_breaks")


def load_all() -> dict[str, Case]:
    import importlib
    for family in FAMILIES:
        importlib.import_module(f"{__name__}.{family}")
    return CASES
