"""The meta verifier (kiln/meta/verify.py, ``config.verify``) over the whole op table: every
entry is captured, and its core graph and its decomposition to prims run node by node on the
real sample inputs, each node's meta (shape, dtype, device, strides of views) checked against
the real tensor. A static capture and a dynamic one (every size symbolic) both verify."""
import pytest

from kiln.capture import frame_locals, trace
from kiln.graph.propagate import propagate_meta
from kiln.graph.verify_meta import verify_meta
from kiln.ops.decompose import decompose
from optable import ENTRIES
from optable.runner import batched, make_samples


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_meta_verifier_passes(entry, dynamic):
    samples = make_samples(entry, "cpu")
    run_all, flat = batched(entry.fn, [args for _, args in samples])
    try:
        result = trace(run_all, flat, dynamic=dynamic)
    except TypeError:  # a trace() without the dynamic option
        pytest.skip("trace() takes no dynamic option")
    inputs = result.fetch(frame_locals(run_all, flat, {}))
    graph = propagate_meta(result.graph)
    verify_meta(graph, inputs)
    verify_meta(decompose(graph), inputs)
