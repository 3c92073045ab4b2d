"""One Config object; environment overrides; ``kiln.config.patch(...)`` for a scope."""
from __future__ import annotations

import contextlib
import dataclasses
import os


def _env_bool(name, default):
    v = os.environ.get(name)
    return default if v is None else v.strip().lower() not in ("", "0", "false", "no")


@dataclasses.dataclass
class Config:
    # training: compile the backward in a thread while the forward builds (autograd/speculate.py);
    # None (default): for CUDA graphs, whose forward build waits on Triton workers (H200: GPT-2's
    # cold training compile 6.7 s -> 4.5 s); CPU graphs' gcc builds leave no idle core on a small
    # host (neutral there). KILN_SPECULATIVE_BACKWARD=1 / 0 forces it on / off.
    speculative_backward: object = dataclasses.field(default_factory=lambda: (
        None if os.environ.get("KILN_SPECULATIVE_BACKWARD") is None else _env_bool("KILN_SPECULATIVE_BACKWARD", False)))
    # capture
    recompile_limit: int = 8
    # entries of a resume function that starts inside a for loop (a graph break in the loop):
    # about one per iteration that looks different (a module list's layers), so more than 8
    loop_resume_limit: int = 64
    # checking
    verify: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_VERIFY", False))
    strict: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_STRICT", False))
    disable: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_DISABLE", False))
    # inductor
    cpu_backend: str = dataclasses.field(default_factory=lambda: os.environ.get("KILN_CPU_BACKEND", "cpp"))
    triton_max_persistent_rblock: int = 4096  # longer rows use looped reductions
    # RBLOCK of a looped (long-row) reduction. KILN_LOOPED_RBLOCK for an A/B: a row of bf16
    # moves 2 KB per step at 1024, and GPT-2's cross-entropy forward ran at 1.86 TB/s on the
    # H200 (fp32 rows: 80% of copy), which suggests too few bytes in flight (not yet measured)
    triton_looped_rblock: int = dataclasses.field(default_factory=lambda: int(os.environ.get("KILN_LOOPED_RBLOCK", "1024")))
    # reductions over strided dims tile [XBLOCK contiguous kept elements, RBLOCK reduced]
    triton_column_reductions: bool = True
    # attention's backward calls torch's fused backward (else: decomposed, probabilities materialized)
    fused_attention_backward: bool = True
    # convolution's backward calls aten.convolution_backward (kiln/ops/conv.py); else the
    # decomposed form (a transposed convolution and a batch/channel-swapped one), much slower
    conv_library_backward: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_CONV_LIBRARY_BACKWARD", True))
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
    # (scheduler.split_onto): on by default; KILN_FUSE_SPLIT_PROLOGUE=0 for an A/B on the device
    # Triton: a where's branches load under its condition when that condition reads indices
    # only (codegen.common KernelWriter.guard_ops, _guards_loads). Off by default: on the H200
    # max_pool2d's backward for [2, 3, 9, 7] is still wrong with index-only masks (session 16),
    # which the interpreter and C++ get right; KILN_GUARDED_LOADS=1 turns it on
    triton_guarded_loads: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_GUARDED_LOADS", False))
    # Triton pointwise kernels that store along the last dim and load a transposed input run
    # over [YBLOCK, XBLOCK] tiles (codegen/triton_tiled.py): x.t() + y at 8192^2 went from 37%
    # to 99% of copy bandwidth on the H200; KILN_TILE_2D=0 for an A/B
    triton_tile_2d: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_TILE_2D", True))
    # C++ pointwise kernels with a transposed load walk 32x32 tiles (codegen/cpp.py
    # _tiled_loops); KILN_CPP_TILE_2D=0 for an A/B
    cpp_tile_2d: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_CPP_TILE_2D", True))
    # C++ reductions over dims that are contiguous only in a trailing group (batch norm's
    # (0, 2, 3)) loop the leading dims outside a vectorized inner run
    # (cpp_reduction.row_split); KILN_CPP_ROW_SPLIT=0 for an A/B
    cpp_row_split: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_CPP_ROW_SPLIT", True))
    # C++ pointwise kernels store bf16 outputs a chunk at a time (codegen/cpp_runs.py)
    cpp_bf16_runs: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_CPP_BF16_RUNS", True))
    # the scheduler first moves each pointwise buffer to just before its first reader
    # (scheduler.sink_pointwise); KILN_SINK_POINTWISE=0 for an A/B
    sink_pointwise: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_SINK_POINTWISE", True))
    fuse_split_prologue: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_FUSE_SPLIT_PROLOGUE", True))
    # online softmax: a looped max pass and the sum(exp(x - max)) pass after it run as one
    triton_online_softmax: bool = True
    # online softmax with one running max per row (a block max per step, then one exp per
    # element and one rescale per row) instead of one per lane (two exps per element). Off: on
    # the H200 the generated form lost (cross-entropy 313 us against 278 us per lane), although
    # a hand-written one without the NaN-propagating lane max reached 244 us. KILN_ONLINE_ROWMAX=1
    triton_online_rowmax: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_ONLINE_ROWMAX", False))
    # max/min combines as tl.maximum/minimum with NaN propagation (one max.NaN instruction on
    # sm_80+) instead of a compare-and-select; KILN_NAN_MAX_OP=0 for the select
    triton_nan_max_op: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_NAN_MAX_OP", True))
    # autotuning of Triton kernels on CUDA (kiln/runtime/autotune.py); "interpret" also tunes
    # under TRITON_INTERPRET (tests only)
    # Off by default (KILN_AUTOTUNE=1 turns it on): on the H200 it made layer_norm slower (it
    # times configs on L2-resident data) and cold compiles 2-3x longer; see docs/architecture.md
    triton_autotune: object = dataclasses.field(default_factory=lambda: os.environ.get("KILN_AUTOTUNE", "0") not in ("0", "false", "no"))
    # GEMM operands padded to aligned sizes (inductor/pad_gemm.py): "auto" on CUDA, "always"
    # (tests on the CPU), "never"; only for GEMMs of at least pad_gemm_min_mnk multiply-adds that are compute bound
    pad_gemm: str = dataclasses.field(default_factory=lambda: os.environ.get("KILN_PAD_GEMM", "auto"))
    pad_gemm_min_mnk: int = 1 << 28
    pad_gemm_min_intensity: float = 100.0  # multiply-adds per element moved (pad_gemm.compute_bound)
    # values are realized in the layout eager would give them (inductor/layout.py): a
    # convolution over channels-last activations gets them channels-last, as in eager;
    # KILN_EAGER_LAYOUTS=0 for an A/B
    eager_layouts: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_EAGER_LAYOUTS", True))
    # convolution inputs channels-last where a graph's convolutions pay for it
    # (inductor/conv_layout.py): "auto" (CUDA inference graphs), "channels_last" (any device,
    # any graph of static 4-d convolutions: tests), "eager" (eager's layouts)
    conv_layout: str = "auto"
    # buffer reuse in the wrapper: a dead buffer of the same size, dtype and device is reused
    reuse_buffers: bool = True
    cpp_flags: tuple = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
    # generated C++ kernels are called through a small extension instead of ctypes
    # (runtime/cpp_call.py); KILN_CPP_CALL=0 keeps ctypes
    cpp_call: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_CPP_CALL", True))
    # the C++ kernels a compile must build go several to one gcc run (runtime/cpp_build.py
    # build_missing); KILN_CPP_BATCH=0 builds each alone
    cpp_batch_builds: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_CPP_BATCH", True))
    # generated C++ includes its prelude from a precompiled header (runtime/cpp_pch.py)
    cpp_pch: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_CPP_PCH", True))
    cpp_compiler: str = dataclasses.field(default_factory=lambda: os.environ.get("CXX", "g++"))
    # runtime
    # the cyclic GC during a compile: "freeze" sets the heap that existed before it aside, so
    # collections scan only what the compile allocates (0.3 s of a 1.75 s training compile on
    # this host was full collections walking torch's heap); "on" leaves it alone; "off"
    # disables it until the compile ends (kiln/context.py)
    compile_gc: str = dataclasses.field(default_factory=lambda: os.environ.get("KILN_COMPILE_GC", "freeze"))
    cache_dir: str = dataclasses.field(default_factory=lambda: os.environ.get(
        "KILN_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "kiln")))
    # whole compiled graphs cached on disk (kiln/runtime/graph_cache.py); KILN_GRAPH_CACHE=0 turns it off
    graph_cache: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_GRAPH_CACHE", True))
    # build pool size (kiln/runtime/pool.py); None: the CPU count (capped); 1: builds in-process
    compile_threads: object = dataclasses.field(default_factory=lambda: int(os.environ["KILN_COMPILE_THREADS"])
                                                if os.environ.get("KILN_COMPILE_THREADS") else None)
    # seconds any one build may take (gcc, a Triton compile in a build worker, the precompiled
    # prelude) before it is killed and the graph falls back with a warning naming the kernel;
    # KILN_BUILD_TIMEOUT (0: no limit)
    build_timeout: float = dataclasses.field(default_factory=lambda: float(os.environ.get("KILN_BUILD_TIMEOUT", "300")))
    # build workers forked by one process that imports Triton once (runtime/pool.py Zygote);
    # off until the full suite has run with it on the H200 (its A/B there: session 23 notes)
    worker_fork: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_WORKER_FORK", False))
    # the parent warms Triton's driver and cache key in threads while lowering runs
    # (runtime/builder.py warm_triton); KILN_TRITON_WARM=0 for an A/B
    triton_warm: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_TRITON_WARM", True))
    # mode="reduce-overhead": which recordings share one memory pool (runtime/cudagraphs.py):
    # "0" none (each recording has its own; outputs handed out as they are), "auto" (default) those
    # whose intermediates are large and outputs small (outputs then cloned per call), "1" all of them
    cudagraph_share: str = dataclasses.field(default_factory=lambda: os.environ.get("KILN_CUDAGRAPH_SHARE", "auto"))
    # "kernels built k/n" on a terminal for compiles with at least this many kernels
    progress_min: int = 8
    aot_min_kernels: int = 4          # fewer Triton kernels compile lazily in-process
    # Triton kernels launched through their compiled launcher (kiln/runtime/launch.py)
    triton_fast_launch: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_FAST_LAUNCH", True))
    # a first launch loads the binary from kiln's record of it, skipping Triton's JIT and its
    # cache key (runtime/triton_binary.py); KILN_TRITON_RECORDS=0 for an A/B
    # a launch line hands the launcher tensor addresses as integers (runtime/launch.py);
    # KILN_POINTER_INTS=0 for an A/B
    triton_pointer_ints: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_POINTER_INTS", True))
    # a bound launch calls a known Triton launcher's C entry point itself (runtime/launch.py);
    # KILN_DIRECT_LAUNCH=0 for an A/B
    triton_direct_launch: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_DIRECT_LAUNCH", True))
    triton_binary_records: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_TRITON_RECORDS", True))
    # observe
    debug: bool = dataclasses.field(default_factory=lambda: _env_bool("KILN_DEBUG", False))
    debug_dir: str = dataclasses.field(default_factory=lambda: os.environ.get("KILN_DEBUG_DIR", "kiln_debug"))

    @contextlib.contextmanager
    def patch(self, **overrides):
        unknown = [k for k in overrides if not hasattr(self, k)]
        if unknown:
            raise AttributeError(f"kiln.config has no setting(s) {unknown}")
        old = {k: getattr(self, k) for k in overrides}
        for k, v in overrides.items():
            setattr(self, k, v)
        try:
            yield self
        finally:
            for k, v in old.items():
                setattr(self, k, v)


config = Config()
