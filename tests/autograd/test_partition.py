"""The joint graph and the partitioner: what is saved, what is recomputed, and that both
graphs verify, print as runnable Python and compute the right grads."""
from __future__ import annotations

import torch

from kiln.autograd import build_joint, partition
from kiln.graph import verify
from kiln.graph.propagate import propagate_meta
from kiln.ops import core

from autograd_helpers import check_grads, trace_core
from testing import assert_close


def chain(x, w, y):
    return core.mul(core.tanh(core.sigmoid(core.mul(x, w))), y)


def mlp(x, w1, w2):
    return core.sum(core.relu(core.mm(core.relu(core.mm(x, w1)), w2)))


def _inputs(*shapes, grad=(True,) * 8):
    return [torch.randn(s).requires_grad_(g) for s, g in zip(shapes, grad)]


def _joint(fn, inputs):
    return build_joint(propagate_meta(trace_core(fn, *inputs)))


def _run_partition(part, inputs, tangents):
    """Run the printed forward and backward graphs like the runtime does."""
    fw = part.forward.as_function()
    bw = part.backward.as_function()
    with torch.no_grad():
        outs = fw(*[t.detach() for t in inputs])
        n = part.num_user_outputs
        returned = iter(outs[n:])
        saved = [inputs[i].detach() if i is not None else next(returned) for i in part.saved_inputs]
        grads = bw(*saved, *tangents)
    return outs[:n], dict(zip(part.grad_input_indices, grads))


def test_joint_graph_layout():
    inputs = _inputs((3, 4), (4,), (3, 4), grad=(True, True, False))
    joint = _joint(chain, inputs)
    verify(joint.graph, ("core",))
    names = [p.name for p in joint.graph.placeholders]
    assert names == ["x0", "x1", "x2", "tangent_0"]
    assert joint.diff_outputs == [True]
    assert joint.grads[0] is not None and joint.grads[1] is not None and joint.grads[2] is None
    kinds = {n.meta.get("joint") for n in joint.graph.nodes if n.op == "call"}
    assert kinds == {"forward", "backward"}
    # the printed joint graph runs and gives eager's grads
    x, w, y = inputs
    t = torch.randn(3, 4)
    out, gx, gw, gy = joint.graph.as_function()(x.detach(), w.detach(), y, t)
    ex = chain(x, w, y)
    ex_gx, ex_gw = torch.autograd.grad(ex, (x, w), t)
    assert gy is None
    assert_close(out, ex.detach())
    assert_close(gx, ex_gx)
    assert_close(gw, ex_gw)


def test_min_cut_saves_fewer_bytes_than_save_all_on_a_pointwise_chain():
    inputs = _inputs((16, 32), (32,), (16, 32))
    joint = _joint(chain, inputs)
    everything = partition(joint, "save_all")
    cut = partition(joint, "min_cut")
    print(f"saved bytes: save_all {everything.saved_bytes}, min_cut {cut.saved_bytes}")
    assert cut.saved_bytes < everything.saved_bytes
    # min-cut keeps the three inputs and recomputes sigmoid/tanh in the backward
    assert sorted(n.name for n in cut.saved) == ["x0", "x1", "x2"]
    recomputed = {n.target for n in cut.backward.nodes if n.meta.get("joint") == "forward"}
    assert core.sigmoid in recomputed and core.tanh in recomputed
    for part in (everything, cut):
        verify(part.forward, ("core",))
        verify(part.backward, ("core",))
        for n in part.forward.nodes + part.backward.nodes:
            v = n.meta.get("val")
            assert not getattr(v, "requires_grad", False), n  # no recursion into autograd
        t = torch.randn(16, 32)
        outs, grads = _run_partition(part, inputs, [t])
        ex = chain(*inputs)
        eg = torch.autograd.grad(ex, inputs, t)
        assert_close(outs[0], ex.detach())
        for i in range(3):
            assert_close(grads[i], eg[i])


def test_min_cut_never_recomputes_mm_and_saves_reductions():
    inputs = _inputs((8, 16), (16, 32), (32, 4))
    joint = _joint(mlp, inputs)
    for strategy in ("save_all", "min_cut"):
        part = partition(joint, strategy)
        fw_in_bw = [n for n in part.backward.nodes if n.meta.get("joint") == "forward"]
        assert not [n for n in fw_in_bw if n.target in (core.mm, core.linear, core.sum)], fw_in_bw
        mm_out = [n for n in part.saved if n.target is core.mm
                  or (n.target is core.relu and n.args[0].target is core.mm)]
        assert mm_out, "the first mm's output (or the relu on it) must be saved, not recomputed"
        t = torch.randn(())
        outs, grads = _run_partition(part, inputs, [t])
        eg = torch.autograd.grad(mlp(*inputs), inputs, t)
        for i in range(3):
            assert_close(grads[i], eg[i])


def test_min_cut_prefers_the_smaller_tensor():
    # exp(x) is returned and needed by its own backward: saving it (1 tensor) beats saving x
    # and recomputing, and the bool mask of relu is cheaper than its float input.
    inputs = _inputs((64,))
    part = partition(_joint(lambda x: core.relu(core.exp(x)), inputs), "min_cut")
    assert part.saved_bytes <= 64 * 4 + 64


def test_output_that_is_an_input_and_repeated_outputs():
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(3, 4, requires_grad=True)
    check_grads(lambda x, w: (x, core.mul(x, w), core.mul(x, w)), [x, w], "aot_eager")
    check_grads(lambda x, w: (x, core.mul(x, w)), [x, w], "kiln")


def test_non_differentiable_outputs_and_inputs():
    x = torch.randn(3, 4, requires_grad=True)
    k = torch.randn(3, 4)
    for backend in ("aot_eager", "kiln"):
        check_grads(lambda x, k: (core.gt(x, 0), core.mul(x, k), core.exp(k), core.argmax(x, 1)),
                    [x, k], backend)


def test_constants_are_never_saved():
    from kiln.graph import Graph, Proxy
    from kiln.meta import TensorMeta
    from kiln.pipeline import compile_graph

    x = torch.randn(3, 4, requires_grad=True)
    c = torch.randn(3, 4)
    g = Graph("with_constant")
    px = Proxy(g.placeholder("x", TensorMeta.of(x)))
    pc = Proxy(g.get_attr("c", c))
    g.output((core.mul(core.sigmoid(px), pc),))
    joint = build_joint(propagate_meta(g))
    for strategy in ("save_all", "min_cut"):
        part = partition(joint, strategy)
        assert all(n.op != "get_attr" for n in part.saved)
        assert any(n.op == "get_attr" for n in part.backward.nodes)
    (y,) = compile_graph(g, "aot_eager")(x)
    (gx,) = torch.autograd.grad(y, x, torch.ones(3, 4))
    s = torch.sigmoid(x.detach())
    assert_close(gx, s * (1 - s) * c)
