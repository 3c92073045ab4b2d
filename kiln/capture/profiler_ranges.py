"""``torch.profiler.record_function(name)`` (also ``torch.autograd.profiler.record_function``)
in traced code: a profiler range around Python code, which compiled code runs as a no-op, as
Dynamo does. Inside one graph a range would mark when the graph's launches were issued, not the
work it names, so keeping it would mislead; kiln's own ``kiln: <fn>`` and ``kiln kernel: <k>``
ranges (runtime) show the compiled code in a profile instead. torch.optim's ``step`` wraps every
optimizer step in one, and model code uses them to label blocks: each was 3 graph breaks."""
from __future__ import annotations

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.values import ConstantVariable, Variable

RANGE_CLASSES = (torch.autograd.profiler.record_function,)


def _noop_exit(*exc_info):
    """The range's ``__exit__`` when a graph break inside the block is resumed: the resumed
    code runs outside the range (the profile loses that label, nothing else)."""
    return None


class ProfilerRangeVariable(Variable):
    def __init__(self, cls):
        self.cls = cls

    def python_type(self):
        return self.cls

    def truth(self, tx):
        return True

    def enter(self, tx):
        """BEFORE_WITH's protocol: (the exit callable, what ``__enter__`` returns: the range)."""
        return ProfilerExitVariable(), self

    def getattr(self, tx, name):
        raise Unsupported(f"attribute {name!r} of a {self.cls.__name__} profiler range in compiled code")


class ProfilerExitVariable(Variable):
    """What BEFORE_WITH leaves on the stack; across a graph break the glue loads
    ``_noop_exit`` in its place (resume_glue.py)."""
    glue_value = staticmethod(_noop_exit)

    def call(self, tx, args, kwargs):
        return ConstantVariable(None)


def make_range(tx, cls, args, kwargs):
    """``record_function(name, args=None)``: the name is not evaluated for real (a string
    built from values of the trace stays a value of the trace)."""
    if len(args) > 2:
        raise Unsupported(f"{cls.__name__} with {len(args)} arguments")
    return ProfilerRangeVariable(cls)
