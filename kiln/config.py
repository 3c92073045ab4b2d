"""kiln's settings: one ``Config`` object, ``kiln.config``.

Where a value comes from, latest first:

* ``kiln.config.patch(name=value)`` for a ``with`` scope, or ``kiln.config.name = value``;
* ``KILN_CONFIG=name=value,name=value`` in the environment (every setting, by field name,
  parsed by the field's type; an unknown name or a bad value is an error at import);
* the public variable of the few settings that have one (``PUBLIC_ENV``; README lists them);
* the field's default.

``python -m kiln config`` prints every setting, its value and where the value came from.
Experiment switches (A/B tests of one codegen choice) are fields without a public variable:
``KILN_CONFIG=triton_tile_2d=0``. Measurements behind the defaults: docs/notes/measurements.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings

# setting -> its public environment variable. With KILN_CONFIG and KILN_LOGS (kiln/log.py)
# these are all the KILN_* variables kiln reads.
PUBLIC_ENV = {
    "disable": "KILN_DISABLE",
    "strict": "KILN_STRICT",
    "verify": "KILN_VERIFY",
    "debug": "KILN_DEBUG",
    "cache_dir": "KILN_CACHE_DIR",
    "compile_threads": "KILN_COMPILE_THREADS",
    "build_timeout": "KILN_BUILD_TIMEOUT",
    "triton_autotune": "KILN_AUTOTUNE",
}


# variables earlier versions read, and the setting each became: one still set in the
# environment gets a warning at import (an A/B that silently measures the default is worse)
RETIRED_ENV = {
    "KILN_SPECULATIVE_BACKWARD": "speculative_backward", "KILN_CPU_BACKEND": "cpu_backend",
    "KILN_LOOPED_RBLOCK": "triton_looped_rblock", "KILN_CONV_LIBRARY_BACKWARD": "conv_library_backward",
    "KILN_GUARDED_LOADS": "triton_guarded_loads", "KILN_TILE_2D": "triton_tile_2d",
    "KILN_CPP_TILE_2D": "cpp_tile_2d", "KILN_CPP_ROW_SPLIT": "cpp_row_split",
    "KILN_CPP_BF16_RUNS": "cpp_bf16_runs", "KILN_SINK_POINTWISE": "sink_pointwise",
    "KILN_FUSE_SPLIT_PROLOGUE": "fuse_split_prologue", "KILN_ONLINE_ROWMAX": "triton_online_rowmax",
    "KILN_NAN_MAX_OP": "triton_nan_max_op", "KILN_PAD_GEMM": "pad_gemm",
    "KILN_EAGER_LAYOUTS": "eager_layouts", "KILN_CPP_CALL": "cpp_call", "KILN_CPP_BATCH": "cpp_batch_builds",
    "KILN_CPP_PCH": "cpp_pch", "KILN_COMPILE_GC": "compile_gc", "KILN_GRAPH_CACHE": "graph_cache",
    "KILN_WORKER_FORK": "worker_fork", "KILN_WORKER_NICE": "worker_nice", "KILN_WORKER_TORCH": "worker_torch",
    "KILN_AOT_LAUNCHERS": "aot_launchers", "KILN_TRITON_WARM": "triton_warm",
    "KILN_CUDAGRAPH_SHARE": "cudagraph_share", "KILN_FAST_LAUNCH": "triton_fast_launch",
    "KILN_POINTER_INTS": "triton_pointer_ints", "KILN_DIRECT_LAUNCH": "triton_direct_launch",
    "KILN_TRITON_RECORDS": "triton_binary_records", "KILN_DEBUG_DIR": "debug_dir",
}


class ConfigError(ValueError):
    pass


_FALSE = ("", "0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError(f"expected one of {_TRUE + _FALSE[1:]}")


def _optional(parse):
    def run(text: str):
        return None if text.strip().lower() in ("", "none", "auto") else parse(text)
    return run


def _autotune(text: str):
    return "interpret" if text.strip() == "interpret" else _bool(text)


# a field's annotation (a string: this module uses postponed annotations) -> its parser
_PARSERS = {
    "bool": _bool, "int": int, "float": float, "str": str,
    "tuple": lambda t: tuple(t.split()),
    "bool | None": _optional(_bool), "int | None": _optional(int),
    "bool | str": _autotune,
}


@dataclasses.dataclass
class Config:
    # ---- checking (KILN_DISABLE, KILN_STRICT, KILN_VERIFY)
    disable: bool = False   # every compiled function runs eagerly
    strict: bool = False    # an internal error raises instead of falling back to eager
    verify: bool = False    # graph.verify on the captured and the prims graph
    # ---- capture
    recompile_limit: int = 8
    # entries of a resume function that starts inside a for loop (a graph break in the loop):
    # about one per iteration that looks different (a module list's layers), so more than 8
    loop_resume_limit: int = 64
    # ---- autograd
    # compile the backward in a thread while the forward builds (autograd/speculate.py). None:
    # only for CUDA graphs, whose forward build waits on Triton workers; the CPU's gcc builds
    # leave no idle core on a small host
    speculative_backward: bool | None = None
    # attention's backward calls torch's fused backward (else: decomposed, probabilities kept)
    fused_attention_backward: bool = True
    # convolution's backward calls aten.convolution_backward (ops/conv.py); the decomposed form
    # (a transposed convolution and a batch/channel-swapped one) is much slower
    conv_library_backward: bool = True
    # ---- lowering and scheduling
    cpu_backend: str = "cpp"   # "cpp", or "triton" under TRITON_INTERPRET=1 (tests)
    # split reductions (lowering.reduction): few rows over a long reduced extent become a
    # partial reduction over row x chunk, then a small second reduction over the chunks
    split_reductions: bool = True
    split_reduction_min_rnumel: int = 1 << 16   # only reduced extents at least this long
    split_reduction_min_chunk: int = 4096       # each chunk reduces at least this many elements
    split_reduction_rows_cuda: int = 1024       # aim for about this many (row, chunk) programs
    split_reduction_rows_cpu: int = 0           # 0: 8 x the OpenMP thread count
    # few kept elements over many reduced rows: "cuda" (only there), "always" (tests), "never"
    split_column_reductions: str = "cuda"
    # the first stage of a split reduction takes in the pointwise kernel producing its input
    # (scheduler.split_onto)
    fuse_split_prologue: bool = True
    # the scheduler first moves each pointwise buffer to just before its first reader
    # (scheduler.sink_pointwise), so it can fuse there
    sink_pointwise: bool = True
    # values are realized in the layout eager would give them (inductor/layout.py): a
    # convolution over channels-last activations gets them channels-last, as in eager
    eager_layouts: bool = True
    # GEMM operands padded to aligned sizes (inductor/pad_gemm.py): "auto" on CUDA, "always"
    # (tests on the CPU), "never"; only GEMMs of at least pad_gemm_min_mnk multiply-adds that
    # are compute bound
    pad_gemm: str = "auto"
    pad_gemm_min_mnk: int = 1 << 28
    pad_gemm_min_intensity: float = 100.0  # multiply-adds per element moved (pad_gemm.compute_bound)
    # convolution inputs channels-last where a graph's convolutions pay for it
    # (inductor/conv_layout.py): "auto" (CUDA inference graphs), "channels_last" (any device,
    # any graph of static 4-d convolutions: tests), "eager" (eager's layouts)
    conv_layout: str = "auto"
    # buffer reuse in the wrapper: a dead buffer of the same size, dtype and device is reused
    reuse_buffers: bool = True
    # ---- Triton code generation
    triton_max_persistent_rblock: int = 4096  # longer rows use looped reductions
    triton_looped_rblock: int = 1024          # RBLOCK of a looped (long-row) reduction
    # reductions over strided dims tile [XBLOCK contiguous kept elements, RBLOCK reduced]
    triton_column_reductions: bool = True
    # a where's branches load under its condition when that condition reads indices only
    # (codegen.common KernelWriter.guard_ops). Off: a max_pool2d backward came out wrong on a
    # GPU with index-only masks, while the interpreter and C++ get it right
    triton_guarded_loads: bool = False
    # pointwise kernels that store along the last dim and load a transposed input run over
    # [YBLOCK, XBLOCK] tiles (codegen/triton_tiled.py), so both sides read whole sectors
    triton_tile_2d: bool = True
    # online softmax: a looped max pass and the sum(exp(x - max)) pass after it run as one
    triton_online_softmax: bool = True
    # online softmax with one running max per row instead of one per lane. Off: the generated
    # form lost to the per-lane one
    triton_online_rowmax: bool = False
    # max/min combine as tl.maximum/minimum with NaN propagation (one instruction on sm_80+)
    # instead of a compare-and-select
    triton_nan_max_op: bool = True
    # autotuning of Triton kernels on CUDA (runtime/autotune.py) and of C++ chunk sizes
    # (codegen/cpp_tune.py); "interpret" also tunes under TRITON_INTERPRET (tests only). Off by
    # default: it times configs on cache-resident data and makes cold compiles 2-3x longer
    triton_autotune: bool | str = False
    # ---- C++ code generation and builds
    # pointwise kernels with a transposed load walk 32x32 tiles (codegen/cpp.py _tiled_loops)
    cpp_tile_2d: bool = True
    # reductions over dims that are contiguous only in a trailing group (batch norm's (0, 2, 3))
    # loop the leading dims outside a vectorized inner run (cpp_reduction.row_split)
    cpp_row_split: bool = True
    # a pointwise row indexed modulo C (RoPE's rotate_half) loops as [N / C, C], affine inside
    # (codegen/cpp.py split_inner_dim)
    cpp_split_modulo: bool = True
    # pointwise kernels store bf16 outputs a chunk at a time (codegen/cpp_runs.py)
    cpp_bf16_runs: bool = True
    # -fno-trapping-math: without it gcc will not if-convert a float compare, so every loop
    # with a clamp, a select or kiln_expf (softmax, sigmoid, SiLU, GELU) stayed scalar. Values do
    # not change: it only drops the promise that FP exceptions trap, and torch never unmasks
    # them. -fno-math-errno lets sqrt and friends inline as vector instructions (errno is never
    # read). No flag here may change a result: no -ffast-math, no contraction beyond the
    # std::fma the code writes.
    # -mprefer-vector-width=512: gcc's tuning for Intel's AVX-512 server parts vectorizes loops
    # 256 bits wide unless told otherwise; Inductor's kernels use 512-bit vectors there
    # (docs/notes/measurements.md). On a target without AVX-512 it changes nothing.
    cpp_flags: tuple = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
                        "-fno-trapping-math", "-fno-math-errno", "-mprefer-vector-width=512")
    cpp_compiler: str = dataclasses.field(default_factory=lambda: os.environ.get("CXX", "g++"))
    # kernels are called through a small extension instead of ctypes (runtime/cpp_call.py)
    cpp_call: bool = True
    # the kernels a compile must build go several to one gcc run (runtime/cpp_build.py)
    cpp_batch_builds: bool = True
    # generated C++ includes its prelude from a precompiled header (runtime/cpp_pch.py)
    cpp_pch: bool = True
    # ---- runtime
    # the cyclic GC during a compile (context.py): "freeze" sets the heap that existed before
    # it aside, so collections scan only what the compile allocates; "on" leaves it alone;
    # "off" disables it until the compile ends
    compile_gc: str = "freeze"
    cache_dir: str = os.path.join(os.path.expanduser("~"), ".cache", "kiln")  # KILN_CACHE_DIR
    # whole compiled graphs cached on disk (runtime/graph_cache.py)
    graph_cache: bool = True
    # build pool size (runtime/pool.py); None: the CPU count (capped); 1: builds in-process
    compile_threads: int | None = None
    # seconds any one build may take (gcc, a Triton compile in a build worker, the precompiled
    # prelude) before it is killed and the graph falls back with a warning naming the kernel;
    # 0: no limit
    build_timeout: float = 300.0
    # build workers forked by one process that imports Triton once (runtime/pool.py Zygote);
    # off until the full suite has run with it on a GPU host
    worker_fork: bool = False
    # build workers run this many nice steps below the compiling process, whose own Python
    # stages are on the compile's critical path (runtime/build_worker.py); 0: the same priority
    worker_nice: int = 10
    # build workers may import torch (they block it: its import costs seconds per worker)
    worker_torch: bool = False
    # build workers build each Triton kernel's C launcher beside its compile
    # (runtime/build_worker.py _early_launchers)
    aot_launchers: bool = True
    # the parent warms Triton's driver and cache key in threads while lowering runs
    # (runtime/builder.py warm_triton)
    triton_warm: bool = True
    # mode="reduce-overhead": which recordings share one memory pool (runtime/cudagraphs.py):
    # "0" none (outputs handed out as they are), "auto" those whose intermediates are large and
    # outputs small (outputs then cloned per call), "1" all of them
    cudagraph_share: str = "auto"
    progress_min: int = 8     # "kernels built k/n" on a terminal for compiles with this many
    aot_min_kernels: int = 4  # fewer Triton kernels compile lazily in-process
    # Triton kernels launched through their compiled launcher (runtime/launch.py)
    triton_fast_launch: bool = True
    # a first launch loads the binary from kiln's record of it, skipping Triton's JIT and its
    # cache key (runtime/triton_binary.py)
    triton_binary_records: bool = True
    # a launch line hands the launcher tensor addresses as integers (runtime/launch.py)
    triton_pointer_ints: bool = True
    # a bound launch calls a known Triton launcher's C entry point itself (runtime/launch.py)
    triton_direct_launch: bool = True
    # ---- observe (KILN_DEBUG)
    debug: bool = False             # one dump folder per compile (observe/debug.py)
    debug_dir: str = "kiln_debug"   # where KILN_DEBUG's run folders go

    def __post_init__(self):
        object.__setattr__(self, "_sources", {f.name: "default" for f in dataclasses.fields(self)})
        object.__setattr__(self, "_patching", False)

    def __setattr__(self, name, value):
        if name not in _FIELDS:  # a typo would otherwise set a setting nothing reads
            raise AttributeError(f"kiln.config has no setting {name!r}; settings: {', '.join(sorted(_FIELDS))}")
        object.__setattr__(self, name, value)
        sources = self.__dict__.get("_sources")
        if sources is not None:  # None while the dataclass __init__ sets the defaults
            sources[name] = "patch" if self._patching else "set in code"

    def source(self, name: str) -> str:
        """Where the setting's value came from: default, KILN_CONFIG, its KILN_* variable,
        patch, or set in code."""
        return self._sources[name]

    def load_environment(self, environ=os.environ):
        """Apply the public variables, then KILN_CONFIG (a ConfigError names a bad entry)."""
        for var, name in RETIRED_ENV.items():
            if var in environ:
                warnings.warn(f"kiln: {var} is no longer read; set KILN_CONFIG={name}={environ[var]} instead",
                              stacklevel=2)
        for name, var in PUBLIC_ENV.items():
            if environ.get(var) is not None:
                self._set_parsed(name, environ[var], var)
        for item in filter(None, (s.strip() for s in environ.get("KILN_CONFIG", "").split(","))):
            name, sep, text = item.partition("=")
            name = name.strip()
            if not sep:
                raise ConfigError(f"KILN_CONFIG: {item!r} is not name=value")
            if name not in _FIELDS:
                raise ConfigError(f"KILN_CONFIG: unknown setting {name!r}; known settings: "
                                  f"{', '.join(sorted(_FIELDS))}")
            self._set_parsed(name, text, "KILN_CONFIG")

    def _set_parsed(self, name: str, text: str, where: str):
        kind = _FIELDS[name].type
        if kind not in _PARSERS:  # a field annotated with a type this table does not know
            raise ConfigError(f"{where}: {name} ({kind}) cannot be set from text; set it in code")
        try:
            value = _PARSERS[kind](text)
        except ValueError as e:
            raise ConfigError(f"{where}: {name}={text!r} is not a valid {kind} ({e})") from None
        object.__setattr__(self, name, value)
        self._sources[name] = where

    @contextlib.contextmanager
    def patch(self, **overrides):
        unknown = [k for k in overrides if k not in _FIELDS]
        if unknown:
            raise AttributeError(f"kiln.config has no setting(s) {unknown}; settings: {', '.join(sorted(_FIELDS))}")
        old = {k: (getattr(self, k), self._sources[k]) for k in overrides}
        object.__setattr__(self, "_patching", True)
        try:
            for k, v in overrides.items():
                setattr(self, k, v)
        finally:
            object.__setattr__(self, "_patching", False)
        try:
            yield self
        finally:
            for k, (v, src) in old.items():
                object.__setattr__(self, k, v)
                self._sources[k] = src

    def table(self) -> list[tuple[str, object, str]]:
        """(name, value, source) of every setting, in declaration order."""
        return [(f.name, getattr(self, f.name), self._sources[f.name]) for f in dataclasses.fields(self)]


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def main(argv=None) -> int:
    """``python -m kiln config``: every setting, its value, and where the value came from."""
    rows = config.table()
    width = max(len(n) for n, _, _ in rows)
    vwidth = min(40, max(len(repr(v)) for _, v, _ in rows))
    for name, value, source in rows:
        var = f"  ({PUBLIC_ENV[name]})" if name in PUBLIC_ENV and source != PUBLIC_ENV[name] else ""
        print(f"{name:<{width}}  {value!r:<{vwidth}}  {source}{var}")
    print("\nset for a process with KILN_CONFIG=name=value,...; for a scope with kiln.config.patch(name=value)",
          file=sys.stderr)
    return 0


config = Config()
config.load_environment()
