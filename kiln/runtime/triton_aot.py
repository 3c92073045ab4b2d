"""Ahead-of-time Triton builds: every kernel of a compile is compiled in the build pool's
worker processes before the wrapper's first launch, so that launch finds its binary in Triton's
disk cache instead of compiling kernels one after another.

A worker compiles through Triton's own JIT entry point (``JITFunction.warmup``) with stand-in
arguments that specialize like the real launch's: pointer dtypes and 16-byte alignment (buffers
the wrapper allocates always are; inputs are assumed to be), the integer scalars' values (their
hints when symbolic), the constexprs and ``num_warps``. Triton then computes the same cache key
the parent's first launch computes. A prediction that misses (an unaligned input, say) costs
only the lazy compile at that launch, never a wrong kernel: the launch compiles for what it sees.

Used only when compiling for a real GPU (not the interpreter), with a pool of more than one
worker, and with a Triton whose JIT has ``warmup`` and a settable driver; anything else keeps the
lazy path. ``supported()`` says which.
"""
from __future__ import annotations

import os
import time

from kiln import counters, log
from kiln.config import config
from kiln.inductor.codegen.triton import interpreting
from kiln.meta.symbolic import shape_env_of

_DTYPE_NAMES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
                "uint8", "bool"}


def supported() -> str | None:
    """None when AOT builds can run here, else why not."""
    if interpreting():
        return "the Triton interpreter runs kernels (TRITON_INTERPRET=1)"
    try:
        import torch
        if not torch.cuda.is_available():
            return "no CUDA device"
        import triton  # optional dependency: loaded only for Triton kernels
        from triton.runtime import driver
        from triton.runtime.jit import JITFunction
    except Exception as e:  # noqa: BLE001
        return f"Triton is not importable ({e})"
    if not hasattr(JITFunction, "warmup") or not hasattr(driver, "set_active"):
        return f"Triton {triton.__version__} lacks JITFunction.warmup or driver.set_active"
    return None


def current_target() -> list:
    """[backend, arch, warp size] of the current GPU, as Triton's CUDA driver names it
    (``get_current_target``: the capability's major * 10 + minor, warps of 32), from torch: the
    driver would build its C helper module first on a cold Triton cache, on the critical path
    between codegen and the first build request. Other backends ask their driver."""
    import torch
    if torch.version.hip is None:
        major, minor = torch.cuda.get_device_capability()
        return ["cuda", major * 10 + minor, 32]
    from triton.runtime import driver  # optional dependency: loaded only for Triton kernels

    from kiln.runtime.builder import wait_triton_driver
    wait_triton_driver()
    t = driver.active.get_current_target()
    return [t.backend, t.arch, t.warp_size]


def _predict_int(value, hints: dict):
    if isinstance(value, int):
        return value
    try:
        return int(eval(str(value), {"__builtins__": {}}, dict(hints)))  # wrapper expressions over s0, s1 ...
    except Exception:  # noqa: BLE001
        return None


def describe(kernel, buffers: dict, hints: dict) -> dict | None:
    """The AOT request of one generated Triton kernel, or None when it cannot be predicted
    (tuned kernels, unknown dtypes, sizes with no hint)."""
    if getattr(kernel, "tune", None) is not None or not hasattr(kernel, "constexprs"):
        return None
    args = []
    for name in kernel.args:
        b = buffers.get(name)
        dtype = str(getattr(b, "dtype", "")).replace("torch.", "")
        if dtype not in _DTYPE_NAMES:
            return None
        args.append(["ptr", dtype, 16])
    for s in kernel.scalars:
        v = _predict_int(s, hints)
        if v is None:
            return None
        args.append(["int", v])
    kwargs = {k: v for k, v in kernel.constexprs.items()}
    kwargs["num_warps"] = kernel.num_warps
    return {"name": kernel.name, "args": args, "kwargs": kwargs}


def symbol_hints(graph) -> dict:
    """Symbol name -> traced value, for the sizes of a graph's inputs."""
    env = shape_env_of([n.meta["val"] for n in graph.placeholders])
    return {} if env is None else {s.name: int(v) for s, v in env.hints.items()}


def _keep_record(req, reply):
    """Save the worker's record of the binary under the key the parent's first launch computes
    from its real arguments (``triton_binary``): the launch then skips Triton's JIT."""
    record = reply.get("record")
    if record is None:
        if req.get("record"):
            log.log("kernels", "%s: no binary record (%s)", req["name"], reply.get("record_error"))
        return
    from kiln.runtime import triton_binary
    key = triton_binary.record_key(req["module"], req["name"], triton_binary.predicted_facts(req["args"]),
                                   req["kwargs"], triton_binary.arch_of_target(req["target"]))
    triton_binary.save(key, record)


def build_ahead(kernels, launches: dict, pool) -> None:
    """Compile every describable kernel in the pool's workers (errors are logged: the lazy
    path at launch reports a real compile error with its own message)."""
    from kiln.runtime.triton_load import ensure_triton_cache_dir, module_name, source_path
    ensure_triton_cache_dir()
    target = current_target()
    jobs = []
    # longest first (a kernel's source length stands for its compile time): the pool's threads
    # take jobs in order, and a long kernel that starts last would end the build stage alone
    for k in sorted(kernels, key=lambda k: -len(k.source)):
        req = launches.get(k.name)
        if req is not None:
            jobs.append(dict(req, kind="triton", path=source_path(k.source), module=module_name(k.source),
                             target=target, record=config.triton_binary_records))
    if not jobs:
        return
    t0 = time.perf_counter()
    timed_out = []
    from kiln.runtime.pool import BuildTimeout, build_timeout
    limit = build_timeout()

    def one(req):
        try:
            reply = pool.in_worker(req, limit)
            counters.bump("kernel_builds")
            log.log("kernels", "built %s ahead of time in %.0f ms (its C launcher %.0f ms)", req["name"],
                    reply["seconds"] * 1e3, reply.get("launcher_seconds", 0.0) * 1e3)
            _keep_record(req, reply)
        except BuildTimeout as e:
            timed_out.append(str(e))
        except Exception as e:  # noqa: BLE001
            log.log("kernels", "ahead-of-time build of %s failed; it compiles at its first launch: %s",
                    req["name"], str(e).splitlines()[0] if str(e) else type(e).__name__)
    pool.map(one, jobs)
    if timed_out:
        # compiling it in this process at its first launch would hang there, with no bound
        from kiln.runtime.pool import BuildError
        raise BuildError(timed_out[0] + (f" (and {len(timed_out) - 1} more)" if len(timed_out) > 1 else "") +
                         "; not compiled in this process, where nothing could stop it")
    log.log("perf", "%d Triton kernels built ahead of time in %.0f ms (%d workers)", len(jobs),
            (time.perf_counter() - t0) * 1e3, pool.size)

