"""Compiling a training graph's backward while its forward builds.

The backward of a ``CompiledAutograd`` compiles at its first ``backward()``, from the saved
tensors' and the gradients' real metas. Its Python stages (lowering, scheduling, codegen:
about 1.5 s for GPT-2 small) then start only after the forward has been built and run, although
the forward's build stage spends most of its time waiting on build workers and gcc with the
GIL released.

With ``config.speculative_backward`` (by default for CUDA graphs; ``KILN_CONFIG=speculative_backward=1``
or ``0`` forces it), the forward's build
stage starts a thread that compiles the backward from the metas the partition predicts (the
backward graph's placeholders). At the first ``backward()``, when the real metas equal the
predicted ones, the backward waits for that thread and uses its result; otherwise (a layout
the prediction missed) it compiles as before, and the speculation's result is dropped. An
error in the thread is never raised there: the backward then compiles in the caller, which
reports it as before.

Not speculated: graphs with symbolic sizes (their backward is compiled per layout key),
``kiln.explain`` and ``KILN_DEBUG`` (they record each compile in order), and training where
``backward()`` is never called still pays the thread's compile.
"""
from __future__ import annotations

import threading

from kiln import context, log
from kiln.autograd import function
from kiln.config import config
from kiln.meta.symbolic import free_symbols


class BackwardSpeculation:
    def __init__(self, name: str, part, compiler):
        self.name, self.part, self.compiler = name, part, compiler  # compiler: the driver's
        self.metas = [n.meta["val"].with_(requires_grad=False) for n in part.backward.placeholders]
        self.result = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self):
        """Start the thread (once), for the layouts the forward's lowering gave its saved
        tensors (a channels-last conv graph keeps its own: inductor/lower.py ``_realize_saved``)."""
        with self._lock:
            if self._thread is not None:
                return
            self._use_forward_layouts()
            self._thread = threading.Thread(target=self._run, name=f"kiln-backward-{self.name}", daemon=True)
            self._thread.start()
        log.log("aot", "compiling the backward of %s while its forward builds", self.name)

    def _use_forward_layouts(self):
        ctx = context.current()
        strides = getattr(ctx, "output_strides", None) if ctx is not None else None
        if strides is None:  # a forward from the graph cache: the metas' prediction
            return
        k = self.part.num_user_outputs
        for i, primal in enumerate(self.part.saved_inputs):
            if primal is not None:
                continue
            st = strides[k] if k < len(strides) else None
            k += 1
            m = self.metas[i]
            if st is not None and len(st) == len(m.shape) and all(type(v) is int for v in st) \
                    and tuple(st) != tuple(m.stride):
                self.metas[i] = m.with_(stride=tuple(st))

    def _run(self):
        try:
            self.result = function.compile_backward(self.part, self.compiler, self.metas)
        except BaseException as e:  # noqa: BLE001 - the caller compiles again and reports it
            self.error = e

    def take(self, metas):
        """The compiled backward for these real metas, or None (compile it in the caller)."""
        if self._thread is None or metas != self.metas:
            if self._thread is not None:
                log.log("aot", "the backward of %s was compiled for other layouts than the real ones; "
                        "compiling it again", self.name)
            return None
        self._thread.join()
        if self.error is not None:
            log.log("aot", "the speculative backward of %s failed (%s); compiling it again", self.name,
                    type(self.error).__name__)
            return None
        log.log("aot", "the backward of %s comes from its compile during the forward's build", self.name)
        return self.result


def eligible(forward_metas, recording: bool = False) -> bool:
    """Whether to speculate; ``recording``: a kiln.explain (or the demo) records every compile
    in order (``pipeline.RECORDERS``)."""
    wanted = config.speculative_backward
    if wanted is None:  # auto: graphs on CUDA (see config.speculative_backward)
        wanted = any(getattr(m, "device", None) is not None and m.device.type == "cuda" for m in forward_metas)
    return bool(wanted) and not config.debug and not recording and not free_symbols(forward_metas)


def before_forward_build(spec: BackwardSpeculation):
    """Register the speculation to start when the current compile's next build stage begins
    (``pipeline.build``)."""
    ctx = context.current()
    if ctx is not None:
        ctx.before_build.append(spec.start)
