"""The AOTAutograd stage: VJP rules, joint graph, partitioner, torch.autograd.Function glue.

    captured core graph (inputs require grad)
      -> build_joint     forward + backward from the VJP rules (rules.py)   -> JointGraph
      -> partition       min-cut: what to save, what to recompute          -> forward, backward
      -> runtime         the compiled forward, and a compiler for the backward graph
                         (compile_backward: it compiles lazily, on first backward)
                         -> CompiledAutograd (KilnFunction.apply)

The stage compiles nothing itself: the driver (``pipeline.compile_training``) runs these steps,
compiles the forward graph and hands ``runtime`` the compiler for the backward.
"""
from __future__ import annotations

from kiln import log
from kiln.autograd import speculate
from kiln.autograd.function import DOUBLE_BACKWARD_ERROR, CompiledAutograd, KilnFunction, compile_backward
from kiln.autograd.joint import JointGraph, build_joint, nbytes
from kiln.autograd.partition import Partition, partition
from kiln.autograd.rules import sum_to_shape
from kiln.config import config


def runtime(name: str, part: Partition, forward, backward_compiler, speculation=None):
    """What the compiled training graph runs: a ``CompiledAutograd`` over the compiled
    ``forward``, whose backward graph ``backward_compiler(graph)`` compiles on first use; or
    the forward alone when no output can carry a gradient."""
    if not (part.grad_input_indices and any(part.diff_outputs)):
        return _ForwardOnly(forward, part.num_user_outputs)
    if speculation is not None:
        speculation.start()  # a forward that built nothing (a graph without kernels) starts it here
    return CompiledAutograd(name, part, forward, backward_compiler, speculation=speculation)


# The partitioner's strategy: "min_cut" (rematerialize cheap pointwise work) or "save_all".
DEFAULT_STRATEGY = "min_cut"


def config_strategy() -> str:
    return getattr(config, "partitioner", None) or DEFAULT_STRATEGY


def log_partition(name, part: Partition):
    if not log.enabled("aot"):
        return
    lines = [f"{n.name}: {n.meta['val'].with_(requires_grad=False)} ({nbytes(n.meta['val'])} bytes)"
             + (" [input]" if i is not None else "")
             for n, i in zip(part.saved, part.saved_inputs)]
    log.log("aot", "forward graph of %s:\n%s", name, part.forward.python())
    log.log("aot", "backward graph of %s:\n%s", name, part.backward.python())
    log.log("aot", "saved for backward (%s partitioner): %d tensors, %d bytes", part.strategy,
            len(part.saved), part.saved_bytes)
    log.detail("aot", "saved tensors of %s:\n  %s", name, "\n  ".join(lines) or "(none)")


class _ForwardOnly:
    """No output carries a gradient: only the forward runs, outputs detached from autograd."""

    def __init__(self, forward, n):
        self.forward = forward
        self.n = n
        self.kernel_count = getattr(forward, "kernel_count", 0)
        self.extern_count = getattr(forward, "extern_count", 0)
        self.wrapper_source = getattr(forward, "wrapper_source", None)
        # outputs that are the forward's own inputs (a folded detach): the call path makes them
        # fresh detached aliases (api.CacheEntry), else an input requiring grad came back as is
        self.input_outputs = frozenset(i for i in getattr(forward, "input_outputs", ()) if i < n)

    def __call__(self, *inputs):
        return tuple(self.forward(*inputs)[:self.n])


__all__ = ["runtime", "compile_backward", "speculate", "build_joint", "partition", "JointGraph", "Partition",
           "CompiledAutograd", "KilnFunction", "DOUBLE_BACKWARD_ERROR", "sum_to_shape", "nbytes"]
