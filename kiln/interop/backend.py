"""``torch.compile(m, backend="kiln")``: Dynamo's captured graph through kiln's own stages.

Dynamo captures and guards; kiln takes each ``GraphModule`` from there the way
``CompiledFunction._compile`` takes a captured graph: ``fx_import`` turns it into a kiln Graph
of core ops, then ``pipeline.compile_graph`` runs meta -> autograd -> decomposition ->
inductor -> runtime. Training goes through kiln's autograd stage (a forward and a backward
graph joined to eager autograd by a ``torch.autograd.Function``), not aot_autograd.

Dynamo's guards cover what Dynamo specialized. Kiln's stages may decide more about a
symbolic size (``s0 >= 5``, ``s0 != s1``); those decisions are checked on each call, and a
call that fails them compiles another variant of the graph (up to ``config.recompile_limit``).

Nothing runs eagerly in silence: a graph kiln cannot import (an FX node capture has no rule
for), an internal error in a stage, or the variant limit runs the GraphModule itself, counted
and warned once per reason through ``kiln.eager_runs.note_eager_run``. ``KILN_STRICT=1``
raises instead.
"""
from __future__ import annotations

import itertools
import time

import torch

from kiln import api_args, context, counters, log
from kiln.capture.errors import Unsupported
from kiln.config import config
from kiln.eager_runs import note_eager_run
from kiln.interop.fx_import import FxImporter, guard_check
from kiln.observe.debug import write_dump
from kiln.ops.autocast import run_disabled
from kiln.pipeline import StageError, compile_graph
from kiln.runtime import cudagraphs

_graph_ids = itertools.count()


def backend(gm: torch.fx.GraphModule, example_inputs, *, mode=None, options=None):
    """The ``torch_dynamo_backends`` entry point: Dynamo calls it once per captured graph and
    calls what it returns with the graph's inputs."""
    # torch.compile(..., mode=, options=) reach here; kiln.compile's rules check them
    options = api_args.check(False, None, "kiln", mode, options, False)
    return KilnGraphModule(gm, example_inputs, mode, options)


class _Variant:
    """One compile of the graph: inputs picked from a call, the compiled graph, the outputs
    rebuilt; ``check`` is kiln's extra shape guards (None: nothing to check)."""
    __slots__ = ("fetch", "call", "rebuild", "check", "grad_after", "compiled")

    def __init__(self, imported, compiled, check):
        self.fetch, self.rebuild = imported.fetch, imported.rebuild
        self.grad_after = imported.grad_after
        self.compiled = compiled
        self.call = compiled
        self.check = check

    def run(self, L):
        out = self.rebuild(self.call(*self.fetch(L)), L)
        if self.grad_after is not None:  # the graph leaves a grad mode it set (no_grad at a break)
            torch._C._set_grad_enabled(self.grad_after)
        return out


class KilnGraphModule:
    """What ``backend`` returns: the compiled variants of one GraphModule, else the module."""

    def __init__(self, gm, example_inputs, mode=None, options=None):
        self.gm = gm
        self.mode = mode
        self.options = options or {}
        self.name = f"dynamo_graph_{next(_graph_ids)}"
        self.variants: list[_Variant] = []
        self.eager_reason: str | None = None
        self.eager_where: tuple = (None, None)
        self._compile(list(example_inputs))

    def __call__(self, *args):
        L = {"self": self.gm, "args": args}
        if self.eager_reason is None:
            for v in self.variants:
                if v.check is None or v.check(L):
                    return v.run(L)
            v = self._compile(list(args))
            if v is not None:
                return v.run(L)
        note_eager_run(self.eager_reason, name=self.name, filename=self.eager_where[0],
                       lineno=self.eager_where[1])
        return self.gm(*args)

    @property
    def kernel_count(self) -> int:
        return sum(getattr(v.compiled, "kernel_count", 0) for v in self.variants)

    def _compile(self, examples) -> _Variant | None:
        limit = config.recompile_limit
        if len(self.variants) >= limit:
            return self._eager(f"{self.name}: {limit} variants compiled for kiln's own shape "
                               "guards (config.recompile_limit); it runs eagerly from now on")
        if self.variants:
            counters.bump("recompiles")
            log.log("recompiles", "%s: kiln's shape guards failed; compiling another variant", self.name)
        with context.compiling(self.name) as ctx:
            t0 = time.perf_counter()
            try:
                with context.timed("capture"):
                    imported = FxImporter(self.gm, examples, self.name).run()
            except Unsupported as e:
                if config.strict:
                    raise
                counters.bump("graph_breaks")
                ctx.graph_breaks.append(e)
                return self._eager(f"the FX graph has a node kiln cannot import: {e}",
                                   (e.filename, e.lineno))
            except Exception as e:  # noqa: BLE001 - an internal error while importing
                return self._internal_error(StageError("capture", f"{type(e).__name__}: {e}"))
            ctx.record("capture", "captured_graph", imported.graph)
            try:
                compiled = self._compile_graph(imported.graph)
            except StageError as e:
                return self._internal_error(e)
            check = guard_check(imported.shape_env, imported.static_inputs, imported.value_inputs)  # after the stages: they add guards
            if imported.autocast_devices:  # called inside torch.autocast: the graph holds the casts
                compiled = run_disabled(compiled, imported.autocast_devices)
            if self.mode in api_args.CUDAGRAPH_MODES:
                compiled = cudagraphs.wrap(compiled, imported.graph, self.name,
                                           dynamic=imported.shape_env is not None)
            variant = _Variant(imported, compiled, check)
            self.variants.append(variant)
            counters.bump("frames_compiled")
            counters.bump("graphs_compiled")
            log.log("perf", "compiled %s (torch.compile backend) in %.1f ms", self.name,
                    (time.perf_counter() - t0) * 1e3)
            if config.debug:
                write_dump(ctx, compiled)
            return variant

    def _compile_graph(self, graph):
        if api_args.autotune(self.mode, self.options) and not config.triton_autotune:
            with config.patch(triton_autotune=True):
                return compile_graph(graph, "kiln")
        return compile_graph(graph, "kiln")

    def _internal_error(self, err: StageError):
        counters.bump("fallbacks")
        if config.strict:
            raise err
        return self._eager(f"internal error: {err}")

    def _eager(self, reason: str, where=(None, None)):
        self.eager_reason, self.eager_where = reason, where
        log.log("graph_breaks", "%s runs eagerly: %s", self.name, reason)
        return None
