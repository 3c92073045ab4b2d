"""Running one op-table entry one way, and comparing with plain torch.

Ways:
- ``core_eager``: capture the entry, then run the captured core graph with ``graph.run``, which
  calls each core op's eager implementation directly;
- ``decomp``: the captured graph decomposed to prims, run with ``graph.run``;
- ``aot_eager``: ``kiln.compile(backend="aot_eager", fullgraph=True)``;
- ``kiln_cpp``, ``kiln_triton_interp``, ``kiln_triton_cuda``: ``kiln.compile(backend="kiln",
  fullgraph=True)`` on each code-generation target of ``testing.TARGETS``.

All samples of an entry (every dtype, every shape) run in one function, so one capture and one
build per entry and way; a mismatch names the sample.
"""
from __future__ import annotations

import zlib

import torch

import kiln
from kiln.capture import frame_locals, trace
from kiln.graph.propagate import propagate_meta
from kiln.ops import core
from kiln.ops.decompose import decompose
from testing import TARGETS, TOLERANCES, on_target

EAGER_WAYS = ["core_eager", "decomp", "aot_eager"]
TARGET_WAYS = {"cpp": "kiln_cpp", "triton_interp": "kiln_triton_interp", "triton_cuda": "kiln_triton_cuda"}
WAYS = EAGER_WAYS + [TARGET_WAYS[t.id] for t in TARGETS]
GROUPS = {"kiln": [w for w in TARGET_WAYS.values()], "triton": ["kiln_triton_interp", "kiln_triton_cuda"]}


def marks_for(entry, way):
    """(strict reason, non-strict reason) for this entry and way, from xfail/known."""
    def find(table):
        if way in table:
            return table[way]
        for group, ways in GROUPS.items():
            if group in table and way in ways:
                return table[group]
        return None
    return find(entry.xfail), find(entry.known)


def device_of(way):
    return torch.device("cuda") if way == "kiln_triton_cuda" else torch.device("cpu")


def make_samples(entry, device, dtypes=None):
    """[(dtype, args)] over the entry's dtypes, seeded by the entry's name (reproducible)."""
    torch.manual_seed(zlib.crc32(entry.name.encode()))
    out = []
    for dtype in dtypes or entry.dtypes:
        out += [(dtype, tuple(args)) for args in entry.samples(dtype, device)]
    return out


def batched(fn, arg_lists):
    """One function over the flattened arguments of every sample: returns one result per sample."""
    counts = [len(a) for a in arg_lists]
    flat = tuple(x for a in arg_lists for x in a)

    def run_all(*args):
        outs = []
        i = 0
        for n in counts:
            outs.append(fn(*args[i:i + n]))
            i += n
        return tuple(outs)
    return run_all, flat


def _graph_way(run_all, flat, way, require_core):
    result = trace(run_all, flat)
    graph = result.graph
    if require_core:
        fallbacks = [n.args[0] for n in graph.calls if n.target is core.fallback]
        assert not fallbacks, f"captured graph holds fallback nodes (no core op): {fallbacks}"
    inputs = result.fetch(frame_locals(run_all, flat, {}))
    if way == "decomp":
        graph = decompose(propagate_meta(graph))
        assert all(n.target.namespace == "prims" for n in graph.calls), graph.python()
    return result.rebuild(graph.run(*inputs))


def run(entry, way):
    device = device_of(way)
    samples = make_samples(entry, device)
    expected = [entry.fn(*args) for _, args in samples]
    run_all, flat = batched(entry.fn, [args for _, args in samples])
    if way in ("core_eager", "decomp"):
        actual = _graph_way(run_all, flat, way, entry.core)
    elif way == "aot_eager":
        actual = kiln.compile(run_all, backend="aot_eager", fullgraph=True)(*flat)
    else:
        target = {"kiln_cpp": ("cpu", "cpp"), "kiln_triton_interp": ("cpu", "triton"),
                  "kiln_triton_cuda": ("cuda", "triton")}[way]
        with on_target(target):
            actual = kiln.compile(run_all, fullgraph=True)(*flat)
    if way not in ("core_eager", "decomp"):
        stats = kiln.stats()
        assert stats["frames_compiled"] == 1 and stats["graph_breaks"] == 0, stats
    assert len(actual) == len(expected)
    for i, ((dtype, args), a, e) in enumerate(zip(samples, actual, expected)):
        where = f"{entry.name} [{way}] sample {i} ({_describe(args)})"
        if entry.compare is not None:
            entry.compare(a, e)
        else:
            check(a, e, dtype, entry.tol, where)


def _describe(args):
    def one(a):
        if isinstance(a, torch.Tensor):
            c = "" if a.is_contiguous() else ", non-contiguous"
            return f"{str(a.dtype).split('.')[-1]}{list(a.shape)}{c}"
        return repr(a)
    return ", ".join(one(a) for a in args)


def tolerance(sample_dtype, out_dtype, overrides):
    if sample_dtype in overrides:
        return overrides[sample_dtype]
    if not out_dtype.is_floating_point:
        return 0, 0
    pairs = [TOLERANCES.get(out_dtype, (0, 0)), TOLERANCES.get(sample_dtype, (0, 0))]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def check(actual, expected, dtype, overrides, where):
    """Same structure, dtype and shape as eager exactly; values within the dtype's tolerance."""
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), \
            f"{where}: got {type(actual).__name__} of {len(actual)}, expected {len(expected)}"
        for k, (a, e) in enumerate(zip(actual, expected)):
            check(a, e, dtype, overrides, f"{where} output {k}")
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"
        return
    assert isinstance(actual, torch.Tensor), f"{where}: got {type(actual).__name__}"
    assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype}, eager {expected.dtype}"
    assert actual.shape == expected.shape, f"{where}: shape {tuple(actual.shape)}, eager {tuple(expected.shape)}"
    assert actual.device == expected.device, f"{where}: device {actual.device}, eager {expected.device}"
    rtol, atol = tolerance(dtype, expected.dtype, overrides)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                               msg=lambda m: f"{where}: {m}")
