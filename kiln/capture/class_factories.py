"""Classes made by library functions inside the traced code, made at trace time.

``collections.namedtuple("mytuple", ["x", "y"])`` (and ``typing.NamedTuple``'s functional
form) is a pure function of its arguments: given Python constants, it is called for real once
while tracing and its class is a constant of the capture. Inlining it instead would trace
collections' own source (``exec`` of a generated ``__new__``, classmethod objects), which
capture cannot follow. Its arguments are what the guards already fix: literals of the code, or
values read from the inputs, which are guarded by value as every constant is. Instances then
are namedtuple instances as any other (``values_python.NamedTupleVariable``): made, read,
returned and rebuilt at a break like those of a class defined at module level.

One departure: eager Python makes a new class on every call; the compiled function returns
instances of the one class made while tracing (per compiled entry). Code comparing the class
of two calls' results by identity sees the difference.
"""
from __future__ import annotations

import collections
import typing

from kiln.capture.builtins import handles
from kiln.capture.errors import Unsupported
from kiln.capture.values import ConstantVariable


def _constant_arguments(args, kwargs, what):
    try:
        return [a.as_python() for a in args], {k: v.as_python() for k, v in kwargs.items()}
    except Unsupported:
        raise Unsupported(f"{what} with an argument that is not a Python constant") from None


def _caller_module(tx):
    """The ``__module__`` the class gets in eager: namedtuple reads its caller's globals."""
    frame = tx._current_frame
    return frame.globals.get("__name__", "__main__") if frame is not None else "__main__"


@handles(collections.namedtuple)
def _namedtuple(tx, *args, **kwargs):
    py_args, py_kwargs = _constant_arguments(args, kwargs, "collections.namedtuple")
    if py_kwargs.get("module") is None:
        py_kwargs["module"] = _caller_module(tx)
    try:
        cls = collections.namedtuple(*py_args, **py_kwargs)
    except Exception as e:  # noqa: BLE001 - the break runs it for real, raising there
        raise Unsupported(f"collections.namedtuple(...) raised {e!r}") from None
    return ConstantVariable(cls)


@handles(typing.NamedTuple)
def _typing_namedtuple(tx, *args, **kwargs):
    py_args, py_kwargs = _constant_arguments(args, kwargs, "typing.NamedTuple")
    try:
        cls = typing.NamedTuple(*py_args, **py_kwargs)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"typing.NamedTuple(...) raised {e!r}") from None
    cls.__module__ = _caller_module(tx)
    return ConstantVariable(cls)


__all__ = []
