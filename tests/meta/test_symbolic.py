"""ShapeEnv and SymInt: symbolic arithmetic, guards recorded by specialization, 0/1
specialization, duck sizing, guard simplification; meta rules over symbolic sizes (through
capture with dynamic=True); the meta verifier with symbolic metas."""
import pytest
import sympy
import torch

import kiln
from kiln.capture import trace
from kiln.meta.symbolic import (ShapeEnv, SymInt, concretize, hint_of, py, same_shape,
                                symbolic_meta)
from kiln.graph.verify_meta import MetaMismatch, verify_meta


def _env(*hints):
    env = ShapeEnv()
    return env, [env.create_size(h, f"x.size({i})", duck=False) for i, h in enumerate(hints)]


def test_arithmetic_stays_symbolic_and_records_nothing():
    env, (a, b) = _env(5, 7)
    assert isinstance(a, SymInt) and str(a) == "s0"
    n = a * b * 64
    assert str(n) == "64*s0*s1" and hint_of(n) == 5 * 7 * 64
    assert str(n // (a * 16)) == "4*s1"          # floor division simplifies
    assert (n % 64) == 0 and not env.guards       # a multiple of 64 for every size: no guard
    assert str(a + b - a) == "s1" and (3 * a) // 3 is not None
    assert env.guards == []


def test_comparisons_use_hints_and_record_guards():
    env, (a, b) = _env(5, 7)
    assert (a > 4) is True
    assert (a == b) is False
    assert [str(g) for g, _ in env.guards] == ["s0 > 4", "Ne(s0, s1)"]
    # implied by what is known (sizes >= 2, and now s0 >= 5): no new guard
    assert (a > 1) is True and (a * b >= 10) is True and a != 1
    assert len(env.guards) == 2


def test_int_and_range_specialize():
    env, (a,) = _env(6)
    assert list(range(a)) == list(range(6))
    assert [str(g) for g, _ in env.guards] == ["Eq(s0, 6)"]
    assert float(a) == 6.0


def test_zero_one_specialized_and_duck_sizing():
    env = ShapeEnv()
    assert env.create_size(0, "a") == 0 and isinstance(env.create_size(1, "b"), int)
    s = env.create_size(4, "c")
    t = env.create_size(4, "d")
    u = env.create_size(5, "e")
    assert s.expr is t.expr and s.expr is not u.expr
    assert env.sources[s.expr] == "c"


def test_guards_simplified_before_emission():
    env, (a, b) = _env(9, 3)
    assert a > 3 and a > 5 and a >= 4       # one lower bound survives: s0 >= 6
    assert a + b > 4                         # implied by the bounds: dropped
    lines = env.guard_lines()
    assert lines == ["s0 >= 6", "s1 >= 2"]
    assert env.guard_lines({a.expr: "L['x'].size(0)", b.expr: "L['x'].size(1)"})[0] == "L['x'].size(0) >= 6"


def test_same_shape_records_no_guard():
    env, (a, b) = _env(4, 4)
    assert same_shape((a, 8), (a, 8)) and not same_shape((a, 8), (b, 8))
    assert env.guards == []


def test_python_printing_and_concretize():
    env, (a, b) = _env(4, 6)
    e = (a * b) // 3 + a % 5
    assert eval(py(e), {}, {"s0": 4, "s1": 6}) == (4 * 6) // 3 + 4 % 5
    assert concretize((e, [a, 3]), {a.expr: 10, b.expr: 2}) == ((10 * 2) // 3 + 10 % 5, [10, 3])


def test_symbolic_meta_strides_follow_sizes():
    env = ShapeEnv()
    x = torch.empty(4, 6, 8).transpose(0, 2)      # dense, permuted
    m = symbolic_meta(x, {0, 1, 2}, "L['x']", env)
    assert [str(s) for s in m.shape] == ["s0", "s1", "s2"]
    assert [str(s) for s in m.stride] == ["1", "s0", "s0*s1"]
    y = torch.empty(5, 12)[:, ::2]                # a slice with a step: its row stride is a symbol
    m = symbolic_meta(y, {0, 1}, "L['y']", env)
    assert concretize(tuple(m.stride), {**{s: v for s, v in env.hints.items()}}) == y.stride()


def _capture(fn, *args):
    return trace(fn, args, dynamic=True)


def _out_meta(cap):
    return cap.graph.nodes[-1].args[0][0].meta["val"]


@pytest.mark.parametrize("case", ["reshape", "broadcast", "matmul", "reduce", "views"])
def test_meta_rules_with_symbolic_sizes(case):
    x = torch.randn(3, 4, 5)
    fns = {
        "reshape": (lambda x: x.reshape(-1, x.shape[-1]), "(3*s0, 5)"),
        "broadcast": (lambda x: x + x[:, :1, :], "(3, s0, 5)"),
        "matmul": (lambda x: x @ x.transpose(1, 2), "(3, s0, s0)"),
        "reduce": (lambda x: x.sum(1, keepdim=True).mean(-1), "(3, 1)"),
        "views": (lambda x: x.permute(2, 0, 1).unsqueeze(0).flatten(2), "(1, 5, 3*s0)"),
    }
    fn, want = fns[case]
    kiln.mark_dynamic(x, 1)
    cap = trace(fn, (x,))
    meta = _out_meta(cap)
    shape = tuple(meta.shape)
    assert str(shape).replace("'", "") == want
    sizes = {s: v for s, v in cap.shape_env.hints.items()}
    assert concretize(shape, sizes) == tuple(fn(x).shape)
    verify_meta(cap.graph, cap.fetch({"x": x}))  # each node's meta matches eager torch


def test_meta_verifier_evaluates_symbolic_metas_and_catches_a_wrong_rule(monkeypatch):
    from kiln.meta.tensor_meta import TensorMeta
    from kiln.ops import core
    from kiln.ops.registry import META_RULES

    def f(x):
        return torch.relu(x).sum(0)

    x = torch.randn(6, 7)
    cap = _capture(f, x)
    verify_meta(cap.graph, cap.fetch({"x": x}))
    # the same graph at another size: symbolic metas evaluated at that size still match
    verify_meta(cap.graph, (torch.randn(9, 4),))
    # a meta rule that is wrong (drops a dim): the verifier names the node
    node = next(n for n in cap.graph.nodes if n.op == "call" and n.target is core.sum)
    m = node.meta["val"]
    node.meta["val"] = TensorMeta((m.shape[0], 1), (1, 1), m.dtype, m.device)
    with pytest.raises(MetaMismatch, match="sum"):
        verify_meta(cap.graph, cap.fetch({"x": x}))
    assert META_RULES[core.sum] is not None


def test_verify_config_runs_the_verifier_on_dynamic_compiles():
    def f(x, y):
        return (x.unsqueeze(-1) * y).flatten(1).softmax(-1)

    cf = kiln.compile(f, dynamic=True)
    with kiln.config.patch(verify=True, strict=True):
        for n, m, k in [(3, 5, 4), (6, 2, 7)]:  # no size equal to another (duck sizing)
            x, y = torch.randn(n, m), torch.randn(m, k)
            torch.testing.assert_close(cf(x, y), f(x, y))
    assert kiln.stats()["graphs_compiled"] == 1


def test_guard_sympy_relations_print_as_python():
    env, (a,) = _env(3)
    assert py(sympy.Ne(a.expr, 1)) == "s0 != 1"
