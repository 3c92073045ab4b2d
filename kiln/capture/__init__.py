"""The Dynamo stage: CPython bytecode -> a Graph of core ops, guards, and a way back.

    result = trace(fn, args, kwargs)   # CaptureResult
    L = frame_locals(fn, args, kwargs) # what guards and fetch read
    if result.guard_fn(L, fn.__globals__):
        out = result.rebuild(result.graph.run(*result.fetch(L)))

Anything capture does not handle raises ``Unsupported`` (a graph break) with its reason and
source line.
"""
from kiln.capture.errors import FrameState, Unsupported
from kiln.capture.tracer import CaptureResult, frame_locals, trace

__all__ = ["trace", "CaptureResult", "Unsupported", "FrameState", "frame_locals"]
