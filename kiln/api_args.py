"""Checks of ``kiln.compile``'s arguments: a wrong value is a TypeError or ValueError that
names the argument and says what it accepts, never silently accepted (issue 24, item 8)."""
from __future__ import annotations

# "reduce-overhead": record compiled graphs into CUDA graphs (kiln/runtime/cudagraphs.py);
# "max-autotune": tune kernels (kiln/runtime/autotune.py) and record CUDA graphs, as
# torch.compile's mode of that name does; "max-autotune-no-cudagraphs": tune only.
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
AUTOTUNE_MODES = ("max-autotune", "max-autotune-no-cudagraphs")
BACKENDS = ("kiln", "eager", "aot_eager")

# options={...}: the keys kiln reads, with what each accepts
OPTIONS = {
    "ddp_split": (bool, "True or False: split a DDP module's graph at its buckets (kiln/distributed.py)"),
    "ddp_bucket_bytes": (int, "an int: the bucket size in bytes that DDP graphs split at"),
    "max_autotune": (bool, "True or False: tune the generated kernels, as mode='max-autotune'"),
}


def _is_bool(v) -> bool:
    return type(v) is bool


def check(fullgraph, dynamic, backend, mode, options, disable) -> dict:
    """Raise on a bad argument; returns ``options`` as a dict."""
    if not _is_bool(fullgraph):
        raise TypeError(f"kiln.compile: fullgraph must be True or False, got {fullgraph!r}")
    if dynamic is not None and not _is_bool(dynamic):
        raise TypeError(f"kiln.compile: dynamic must be None (automatic), True or False, got {dynamic!r}")
    if not _is_bool(disable):
        raise TypeError(f"kiln.compile: disable must be True or False, got {disable!r}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"kiln.compile: unknown backend {backend!r}; expected one of "
                         f"{', '.join(map(repr, BACKENDS))}")
    if mode not in MODES:
        raise ValueError(f"kiln.compile: unknown mode {mode!r}; expected one of "
                         f"{', '.join(map(repr, MODES))}")
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"kiln.compile: options must be a dict (or None), got {type(options).__name__}")
    for key, value in options.items():
        if key not in OPTIONS:
            known = "; ".join(f"{k!r}: {what}" for k, (_, what) in OPTIONS.items())
            raise ValueError(f"kiln.compile: unknown options key {key!r}; the known keys are {known}")
        kind, what = OPTIONS[key]
        ok = _is_bool(value) if kind is bool else (type(value) is int or value is None)
        if not ok:
            raise TypeError(f"kiln.compile: options[{key!r}] must be {what}, got {value!r}")
    return dict(options)


def check_more(name, recompile_limit, isolate_recompiles, shapes_spec):
    """torch.compile's newer keywords."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"kiln.compile: name must be a str or None, got {name!r}")
    if recompile_limit is not None and (type(recompile_limit) is not int or recompile_limit < 1):
        raise ValueError(f"kiln.compile: recompile_limit must be None (config.recompile_limit) "
                         f"or an int >= 1, got {recompile_limit!r}")
    if not _is_bool(isolate_recompiles):
        raise TypeError(f"kiln.compile: isolate_recompiles must be True or False, got {isolate_recompiles!r}")
    if shapes_spec is not None:
        raise ValueError("kiln.compile: shapes_spec is not supported; it accepts only None "
                         "(mark sizes with kiln.mark_dynamic or dynamic=True instead)")


def autotune(mode, options) -> bool:
    return mode in AUTOTUNE_MODES or bool(options.get("max_autotune"))
