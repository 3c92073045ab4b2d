"""The whole-graph cache: a compiled graph's wrapper source and kernel list, on disk.

A prims graph compiles to the same wrapper and kernels whenever the graph text (with its
source-line annotations, which kernels carry as comments), the metas of its inputs and
constants (symbolic sizes with their hints and shape-env facts), the target, the versions
(kiln's own sources, torch, Triton) and the code-generation settings are the same. Those form
the key; the entry under ``<cache>/graphs`` is a JSON record. A process that finds it skips
lowering, scheduling and codegen; building then finds every kernel's binary in the kernel
caches (``cpp/``, Triton's own), so nothing is built either.

Entries are written atomically with a digest sidecar (``cache.py``). A corrupt, truncated or
unreadable entry is logged on the ``cache`` channel, removed and rebuilt; one that verifies but
whose wrapper does not build, or whose first call raises, is evicted and the graph compiled
afresh in the same call (``pipeline.compile_prims_graph``).

A second, smaller record under ``<cache>/partitions`` keeps the min-cut partitioner's answer
(the names of the saved nodes) for a joint graph, keyed by the joint graph's text, every node's
meta, its primal/output/tangent/grad nodes and the strategy (``partition_key``): a warm start
then builds the forward and backward graphs without the max-flow.

The cache is skipped while something watches the compile's artifacts (``KILN_DEBUG`` dumps,
``kiln.explain``): a hit has no loop IR or schedule to show.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform

import torch

from kiln import context, log
from kiln.config import config
from kiln.runtime import cache
from kiln.graph.node import GET_ATTR, PLACEHOLDER
from kiln.meta.symbolic import SymInt, shape_env_of
from kiln.meta.tensor_meta import TensorMeta
from kiln.ops.registry import lookup

# settings that cannot change what a graph compiles to
_IRRELEVANT_SETTINGS = {"cache_dir", "debug", "debug_dir", "verify", "strict", "disable", "graph_cache",
                        "compile_threads", "build_timeout",
                        # how kernels are built, launched or scheduled at run time, not what they are
                        "cpp_pch", "cpp_call", "triton_pointer_ints", "triton_direct_launch", "triton_binary_records",
                        "speculative_backward", "triton_warm", "cudagraph_share", "worker_fork"}
ENTRY_FORMAT = 1


@functools.lru_cache(maxsize=None)
def kiln_source_digest() -> str:
    """A digest of every kiln source file: an edited compiler never reuses an old entry.
    (``_KILN_TEST_SOURCE_DIGEST`` pins it, for tests whose processes must agree while the
    sources are being edited around them.)"""
    pinned = os.environ.get("_KILN_TEST_SOURCE_DIGEST")
    if pinned:
        return pinned
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kiln/
    h = hashlib.sha256()
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                p = os.path.join(d, f)
                h.update(os.path.relpath(p, root).encode())
                with open(p, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _versions(target: str) -> str:
    parts = [torch.__version__, platform.machine(), platform.python_version()]
    if target == "triton":
        import triton  # optional dependency: loaded only for Triton kernels
        parts += [triton.__version__, os.environ.get("TRITON_INTERPRET", "0")]
        if torch.cuda.is_available():
            parts += [torch.cuda.get_device_name(), str(torch.cuda.get_device_capability())]
    else:
        from kiln.runtime.cpp_build import compiler_version
        parts += [config.cpp_compiler, compiler_version(config.cpp_compiler)]
    return "|".join(parts)


def _size_text(v) -> str:
    if isinstance(v, SymInt):
        return f"{v.expr}~{v.hint}"
    return str(v)


def _meta_text(m) -> str:
    return (f"{[_size_text(s) for s in m.shape]}/{[_size_text(s) for s in m.stride]}/"
            f"{m.dtype}/{m.device}")


def enabled() -> bool:
    if not config.graph_cache or config.debug:
        return False
    return not context.RECORDERS  # kiln.explain and the demo read every stage's artifacts


def graph_key(prims_graph, target: str) -> str:
    metas = []
    for n in prims_graph.nodes:
        if n.op == PLACEHOLDER:
            metas.append(n.meta["val"])
        elif n.op == GET_ATTR:
            metas.append(TensorMetaLike(prims_graph.constants[n.target]))
    env = shape_env_of(metas)
    env_text = "\n".join(env.describe()) if env is not None else ""
    settings = {k: v for k, v in sorted(vars(config).items()) if k not in _IRRELEVANT_SETTINGS}
    return cache.content_key("graph", ENTRY_FORMAT, kiln_source_digest(), _versions(target), target,
                             prims_graph.python(), "\n".join(_meta_text(m) for m in metas), env_text,
                             repr(settings), repr(getattr(prims_graph, "output_strides", None)),
                             repr(getattr(prims_graph, "saves_for_backward", False)),
                             repr(getattr(prims_graph, "saved_outputs_from", None)),
                             # eager's operand strides for storage-reading fallbacks (decompose)
                             repr([n.meta["eager_arg_strides"] for n in prims_graph.nodes
                                   if "eager_arg_strides" in n.meta]))


class TensorMetaLike:
    __slots__ = ("shape", "stride", "dtype", "device")

    def __init__(self, t):
        self.shape, self.stride, self.dtype, self.device = tuple(t.shape), t.stride(), t.dtype, t.device


def _path(key: str) -> str:
    return os.path.join(cache.subdir("graphs"), key[:2], key + ".json")


# ---------------------------------------------------------------------- kernel records
class CachedKernel:
    """What the build step and the wrapper need of a generated kernel, read back from an entry
    (explain and the debug dump read ``name``, ``source`` and ``origins`` like a generated one)."""
    __slots__ = ("kind", "name", "source", "args", "sizes", "checked", "tune", "origins", "launch")

    def __init__(self, kind, name, source, args, sizes=(), checked=False, tune=None, origins=(),
                 launch=None):
        self.kind, self.name, self.source, self.args = kind, name, source, list(args)
        self.sizes, self.checked, self.tune, self.origins = list(sizes), checked, tune, list(origins)
        self.launch = launch  # Triton: the AOT build's argument description (triton_aot.py)


def _origins(k) -> list:
    return [str(o) for o in (getattr(k, "origins", None) or ())]


def _kernel_record(k, launch) -> dict | None:
    tune = getattr(k, "tune", None)
    rec = {"kind": type(k).__name__, "name": k.name, "source": k.source, "args": list(k.args),
           "sizes": [str(s) for s in getattr(k, "sizes", ())], "checked": bool(getattr(k, "checked", False)),
           "origins": _origins(k), "launch": launch, "tune": None}
    if isinstance(tune, dict):  # a C++ kernel's chunk choices (codegen/cpp_tune.py)
        rec["tune"] = tune
    elif tune is not None:
        if not all(isinstance(s, int) for s in tune.scalars):
            return None
        rec["tune"] = {"name": tune.name, "variants": [[src, cfgs] for src, cfgs in tune.variants],
                       "scalars": list(tune.scalars)}
    return rec


def _kernel_from_record(rec) -> CachedKernel:
    tune = None
    if isinstance(rec["tune"], dict) and "cpp_chunks" in rec["tune"]:
        tune = rec["tune"]
    elif rec["tune"] is not None:
        from kiln.runtime.autotune import TuneSpec
        t = rec["tune"]
        tune = TuneSpec(t["name"], [(src, cfgs) for src, cfgs in t["variants"]], t["scalars"])
    return CachedKernel(rec["kind"], rec["name"], rec["source"], rec["args"], rec["sizes"],
                        rec["checked"], tune, rec["origins"], rec.get("launch"))


# ---------------------------------------------------------------------- entries
class GraphEntry:
    """A compiled graph as read from the cache: enough for ``pipeline.build`` and the wrapper."""
    __slots__ = ("source", "size_args", "kernels", "externs", "extern_count")

    def __init__(self, source, size_args, kernels, externs, extern_count):
        self.source, self.size_args, self.kernels = source, list(size_args), kernels
        self.externs, self.extern_count = externs, extern_count

    def __str__(self):
        return self.source


def _read_record(path: str) -> dict:
    """A JSON entry of this format (ValueError on another format, OSError/JSON errors raised)."""
    with open(path, encoding="utf-8") as f:
        rec = json.load(f)
    if rec.get("format") != ENTRY_FORMAT:
        raise ValueError(f"entry format {rec.get('format')!r}, expected {ENTRY_FORMAT}")
    return rec


def load(key: str) -> GraphEntry | None:
    path = _path(key)
    with cache.reading(path) as ok:
        if not ok:
            return None
        try:
            rec = _read_record(path)
        except (OSError, ValueError) as e:
            rec, err = None, e
    try:
        if rec is None:
            raise err
        externs = [lookup(ns, name) for ns, name in rec["externs"]]
        kernels = [_kernel_from_record(r) for r in rec["kernels"]]
        return GraphEntry(rec["wrapper"], rec["size_args"], kernels, externs, rec["extern_count"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        cache.evict(path, f"{type(e).__name__}: {e}", log_as="unreadable graph cache entry")
        return None


def evict(key: str, why: str):
    """Remove a graph entry that verified but failed to build or run (it is compiled afresh)."""
    cache.evict(_path(key), why, log_as="unusable graph cache entry")


def store(key: str, wrapper, generated: dict, extern_count: int, launches: dict):
    """Write the entry of a freshly built graph (kernels whose record cannot be kept, e.g.
    tuning over symbolic sizes, leave the graph uncached)."""
    records = []
    for k in generated.values():
        rec = _kernel_record(k, launches.get(k.name))
        if rec is None:
            return
        records.append(rec)
    externs = []
    seen = set()
    for ext in wrapper.externs:
        op = ext.op
        if op.name not in seen:
            seen.add(op.name)
            externs.append([op.namespace, op.name])
    entry = {"format": ENTRY_FORMAT, "wrapper": wrapper.source, "size_args": list(wrapper.size_args),
             "kernels": records, "externs": externs, "extern_count": extern_count}
    path = _path(key)
    try:
        cache.store(path, json.dumps(entry).encode())
    except OSError as e:  # a full or read-only disk costs the cache, not the compile
        log.log("cache", "could not write graph cache entry %s: %s", path, e)


# ---------------------------------------------------------------------- partition plans
def _val_text(v) -> str:
    if isinstance(v, TensorMeta):
        return _meta_text(v) + f"/{bool(v.requires_grad)}"
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(_val_text(x) for x in v) + ")"
    return repr(v)


def partition_key(joint, strategy: str) -> str:
    """Everything the partitioner reads: the joint graph's text, every node's meta (sizes,
    strides, dtype, device, requires_grad), which nodes are primals, forward outputs, tangents
    and grads, and the strategy (plus kiln's sources, torch and the settings, as for graphs)."""

    g = joint.graph
    vals = [n.meta.get("val") for n in g.nodes]
    env = shape_env_of([v for v in vals if isinstance(v, TensorMeta)])
    env_text = "\n".join(env.describe()) if env is not None else ""

    def names(nodes):
        return ",".join("-" if n is None else n.name for n in nodes)
    settings = {k: v for k, v in sorted(vars(config).items()) if k not in _IRRELEVANT_SETTINGS}
    return cache.content_key("partition", ENTRY_FORMAT, kiln_source_digest(), torch.__version__, strategy,
                             g.python(), "\n".join(f"{n.name}:{_val_text(v)}" for n, v in zip(g.nodes, vals)),
                             env_text, names(joint.primals), names(joint.fw_outputs), names(joint.tangents),
                             names(joint.grads), repr(settings))


def _plan_path(key: str) -> str:
    return os.path.join(cache.subdir("partitions"), key[:2], key + ".json")


def load_plan(key: str, joint) -> list | None:
    """The saved nodes of an earlier partition of this joint graph, or None (no entry, or one
    that is corrupt or names nodes the graph lacks: logged, removed, recomputed)."""
    path = _plan_path(key)
    with cache.reading(path) as ok:
        if not ok:
            return None
        try:
            rec = _read_record(path)
        except (OSError, ValueError) as e:
            rec, err = None, e
    try:
        if rec is None:
            raise err
        by_name = {n.name: n for n in joint.graph.nodes}
        return [by_name[name] for name in rec["saved"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        drop_plan(key, f"{type(e).__name__}: {e}")
        return None


def drop_plan(key: str, why: str):
    cache.evict(_plan_path(key), why, log_as="unusable partition cache entry")


def store_plan(key: str, saved: list):
    path = _plan_path(key)
    try:
        cache.store(path, json.dumps({"format": ENTRY_FORMAT, "saved": [n.name for n in saved]}).encode())
    except OSError as e:
        log.log("cache", "could not write partition cache entry %s: %s", path, e)
