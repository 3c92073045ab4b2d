"""Graph: building, the runnable printout, the reference executor, dce, cse, verify."""
import pytest
import torch

from kiln.graph import Graph, GraphVerificationError, Proxy, cse, dce, verify
from kiln.meta import TensorMeta
from kiln.ops import core, prims


def _seed_graph(x, b):
    g = Graph("transform")
    xp = Proxy(g.placeholder("x", TensorMeta.of(x)))
    bp = Proxy(g.placeholder("bias", TensorMeta.of(b)))
    g.output((core.mul(core.relu(core.add(xp, bp)), 2),))
    return g


def test_printout_is_runnable_python_and_matches_eager():
    x, b = torch.randn(4, 8), torch.randn(8)
    g = _seed_graph(x, b)
    src = g.python()
    assert "def transform(x, bias):" in src and "core.relu(add)" in src
    fn = g.as_function()
    x2, b2 = torch.randn(4, 8), torch.randn(8)  # fresh inputs: the printout is not specialized
    assert torch.equal(fn(x2, b2)[0], torch.relu(x2 + b2) * 2)


def test_run_is_the_reference_executor():
    x, b = torch.randn(4, 8), torch.randn(8)
    g = _seed_graph(x, b)
    (out,) = g.run(x, b)
    assert torch.equal(out, torch.relu(x + b) * 2)
    with pytest.raises(TypeError, match="takes 2 inputs"):
        g.run(x)


def test_meta_is_computed_when_a_node_is_recorded():
    g = Graph()
    xp = Proxy(g.placeholder("x", TensorMeta.of(torch.randn(3, 1, dtype=torch.float16))))
    y = core.add(xp, 1.5)
    z = core.lt(core.mul(y, xp.node.meta["val"].shape[0]), torch.zeros(()).item())
    assert y.meta.dtype == torch.float16 and y.meta.shape == (3, 1)
    assert z.meta.dtype == torch.bool
    with pytest.raises(ValueError, match="cannot be broadcast"):
        core.add(xp, Proxy(g.placeholder("w", TensorMeta.of(torch.randn(2, 5)))))


def test_dce_removes_unused_calls():
    g = Graph()
    xp = Proxy(g.placeholder("x", TensorMeta.of(torch.randn(4))))
    core.exp(xp)  # dead
    g.output((core.neg(xp),))
    assert len(g.calls) == 2
    dce(g)
    assert [n.target for n in g.calls] == [core.neg]
    verify(g)


def test_cse_merges_identical_calls():
    g = Graph()
    xp = Proxy(g.placeholder("x", TensorMeta.of(torch.randn(4))))
    a, b = core.exp(xp), core.exp(xp)
    g.output((core.add(a, b),))
    cse(g)
    dce(g)
    assert sum(n.target is core.exp for n in g.calls) == 1
    x = torch.randn(4)
    torch.testing.assert_close(g.run(x)[0], torch.exp(x) * 2)


def test_cse_keeps_two_outputs_two_tensors():
    """Two equal calls that are two outputs (or the bases of two outputs' views) stay two: eager
    returns two tensors, and a write into one must not show in the other (torch.optim's
    ``zeros(())`` step counter per parameter counted every parameter's steps)."""
    g = Graph()
    xp = Proxy(g.placeholder("x", TensorMeta.of(torch.randn(4))))
    a, b, c = core.exp(xp), core.exp(xp), core.exp(xp)
    g.output((a, core.reshape(b, (2, 2)), core.add(c, 1)))
    cse(g)
    dce(g)
    assert sum(n.target is core.exp for n in g.calls) == 2  # c, read only inside, merges


def test_compiled_function_returns_two_fresh_tensors_as_two():
    import kiln

    def f(x):
        return torch.zeros(()), torch.zeros(()), torch.zeros(3).view(3, 1), torch.zeros(3) + x
    a, b, c, d = kiln.compile(f)(torch.ones(3))
    assert len({t.data_ptr() for t in (a, b, c, d)}) == 4


def test_verify_reports_wrong_vocabulary_with_the_graph():
    x, b = torch.randn(4, 8), torch.randn(8)
    g = _seed_graph(x, b)
    verify(g, ("core",))
    with pytest.raises(GraphVerificationError, match="outside the vocabulary") as info:
        verify(g, ("prims",))
    assert "def transform" in str(info.value)


def test_prims_refuse_implicit_broadcast_and_promotion():
    g = Graph()
    xp = Proxy(g.placeholder("x", TensorMeta.of(torch.randn(4, 8))))
    bp = Proxy(g.placeholder("b", TensorMeta.of(torch.randn(8))))
    hp = Proxy(g.placeholder("h", TensorMeta.of(torch.randn(4, 8, dtype=torch.float16))))
    with pytest.raises(TypeError, match="prims do not broadcast"):
        prims.add(xp, bp)
    with pytest.raises(TypeError, match="prims do not promote"):
        prims.add(xp, hp)


def test_missing_rule_names_op_and_stage():
    from kiln.ops.registry import DECOMPOSITIONS, MissingRule, define

    op = define("core", "test_only_op_without_rules", lambda x: x)
    with pytest.raises(MissingRule, match=r"\[decomposition\].*core.test_only_op_without_rules"):
        DECOMPOSITIONS[op]


def test_placeholders_stay_first_in_creation_order_around_calls_and_erases():
    g = Graph()
    a = Proxy(g.placeholder("a", TensorMeta.of(torch.randn(3))))
    s = core.add(a, 1.0)
    b = Proxy(g.placeholder("b", TensorMeta.of(torch.randn(3))))  # added after a call
    t = core.mul(s, b)
    c = g.placeholder("c", TensorMeta.of(torch.randn(3)))
    g.erase(c)  # a placeholder gone: the next one still goes right after the remaining ones
    d = Proxy(g.placeholder("d", TensorMeta.of(torch.randn(3))))
    g.output((core.add(t, d),))
    ops = [n.op for n in g.nodes]
    names = [n.name for n in g.placeholders]
    assert names == ["a", "b", "d"]
    assert ops[:3] == ["placeholder"] * 3 and "placeholder" not in ops[3:]
    x, y, z = torch.randn(3), torch.randn(3), torch.randn(3)
    assert torch.allclose(g.run(x, y, z)[0], (x + 1.0) * y + z)
