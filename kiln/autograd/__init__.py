"""The AOTAutograd stage: VJP rules, joint graph, partitioner, torch.autograd.Function glue.

    captured core graph (inputs require grad)
      -> build_joint     forward + backward from the VJP rules (rules.py)   -> JointGraph
      -> partition       min-cut: what to save, what to recompute          -> forward, backward
      -> compile_graph   the forward now; the backward lazily, on first backward
      -> CompiledAutograd (KilnFunction.apply)
"""
from __future__ import annotations

from kiln import context, log
from kiln.autograd import speculate
from kiln.autograd.function import DOUBLE_BACKWARD_ERROR, CompiledAutograd, KilnFunction
from kiln.autograd.joint import JointGraph, build_joint, nbytes
from kiln.autograd.partition import Partition, partition
from kiln.autograd.rules import sum_to_shape
from kiln.config import config


def compile_autograd(graph, backend: str = "kiln", strategy: str | None = None):
    """The autograd stage and the compiles after it; returns a CompiledAutograd, or the
    compiled forward alone when no output can carry a gradient."""
    from kiln.pipeline import _stage, compile_graph

    strategy = strategy or config_strategy()
    joint = _stage("autograd", build_joint, graph)
    if config.verify:
        from kiln.graph import verify
        _stage("autograd", verify, joint.graph, ("core",), name="verify_joint")
    part = _stage("autograd", _partition_named, joint, strategy, graph.name, name="partition")
    ctx = context.current()
    if ctx is not None:
        ctx.record("autograd", "joint_graph", joint.graph)
        ctx.record("autograd", "forward_graph", part.forward)
        ctx.record("autograd", "backward_graph", part.backward)
    if config.verify:
        from kiln.graph import verify
        _stage("autograd", verify, part.forward, ("core",), name="verify_forward")
        _stage("autograd", verify, part.backward, ("core",), name="verify_backward")
    log_partition(graph.name, part)
    trains = bool(part.grad_input_indices) and any(part.diff_outputs)
    spec = None
    if trains and speculate.eligible([n.meta["val"] for n in part.forward.placeholders]):
        spec = speculate.BackwardSpeculation(graph.name, part, backend, None if ctx is None else ctx.compile_id)
        speculate.before_forward_build(spec)
    part.forward.saves_for_backward = trains  # lowering keeps the saved tensors' layouts
    try:
        forward = compile_graph(part.forward, backend)
    finally:
        if spec is not None and ctx is not None and spec.start in ctx.before_build:
            ctx.before_build.remove(spec.start)
    if not trains:
        return _ForwardOnly(forward, part.num_user_outputs)
    if spec is not None:
        spec.start()  # a forward that built nothing (a graph without kernels) starts it here
    return CompiledAutograd(graph.name, part, forward, backend, speculation=spec)


def _partition_named(joint, strategy, name):
    """The partition, with the strategy's answer from the partition cache when an earlier
    process already cut this joint graph (runtime/graph_cache.py: ``partition_key``)."""
    from kiln import counters
    from kiln.runtime import graph_cache

    if not graph_cache.enabled():
        return partition(joint, strategy, name)
    key = graph_cache.partition_key(joint, strategy)
    saved = graph_cache.load_plan(key, joint)
    if saved is not None:
        try:
            part = partition(joint, strategy, name, saved=saved)
        except AssertionError as e:  # the saved set does not cover what the backward reads
            graph_cache.drop_plan(key, str(e))
        else:
            counters.bump("partition_cache_hits")
            log.log("cache", "partition of %s from disk (%d saved)", name, len(saved))
            return part
    part = partition(joint, strategy, name)
    graph_cache.store_plan(key, part.saved)
    return part


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

    def __call__(self, *inputs):
        return tuple(self.forward(*inputs)[:self.n])


__all__ = ["compile_autograd", "build_joint", "partition", "JointGraph", "Partition",
           "CompiledAutograd", "KilnFunction", "DOUBLE_BACKWARD_ERROR", "sum_to_shape", "nbytes"]
