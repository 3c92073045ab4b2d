"""Each op's rules in one place (issue 28): properties are flags on ``define``, the stages read
them instead of name lists, the ops layer imports no stage (stage handles), and exp, sum and mm
keep every rule in their own file."""
import ast
import pathlib

import pytest
import torch

import kiln
import kiln.autograd  # noqa: F401  (registers every VJP rule)
import kiln.capture.torch_api as torch_api
import kiln.inductor.lower  # noqa: F401  (binds the lowering stage's handles)
from kiln.capture import mutation
from kiln.ops import autocast, core, prims
from kiln.ops.registry import (DECOMPOSITIONS, LOWERINGS, META_RULES, VJP_RULES, Deferred, RuleTable,
                               StageAPI, all_ops, define, ops_with)

OPS_DIR = pathlib.Path(kiln.__file__).parent / "ops"
STAGES = ("capture", "autograd", "inductor", "runtime", "observe", "interop", "pipeline", "api")


def test_the_ops_layer_imports_no_stage():
    """kiln/ops sits at the bottom of the layers: no import (top-level or inside a function)
    of a stage, the driver or the api."""
    bad = []
    for path in sorted(OPS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                parts = name.split(".")
                if parts[0] == "kiln" and len(parts) > 1 and parts[1] in STAGES:
                    bad.append(f"{path.name}:{node.lineno}: {name}")
    assert not bad


@pytest.mark.parametrize("name", ["exp", "sum", "mm", "add"])
def test_one_file_holds_every_rule(name):
    """The op file defines the core op and its prim and registers all their rules."""
    path = OPS_DIR / f"op_{name}.py"
    op, prim = getattr(core, name), getattr(prims, name)
    for table in (META_RULES, DECOMPOSITIONS, VJP_RULES):
        assert op in table
    assert prim in META_RULES and prim in LOWERINGS and not isinstance(LOWERINGS[prim], Deferred)
    assert op.autocast is not None and autocast.policy("cuda", name) == op.autocast.get("cuda")
    source = path.read_text()
    for text in (f'"{name}"', 'define("core"', 'define("prims"', "META_RULES", "DECOMPOSITIONS",
                 "VJP_RULES", "LOWERINGS[", "CAPTURE_FUNCTIONS[torch.", "CAPTURE_METHODS[", "autocast="):
        assert text in source, text
    # the rules no other file registers: decomposition, VJP and capture come from here
    module = f"kiln.ops.op_{name}"
    assert DECOMPOSITIONS[op].__module__ == module and VJP_RULES[op].__module__ == module
    assert torch_api.TORCH_FUNCTIONS[getattr(torch, name)] is not None
    for other in OPS_DIR.parent.rglob("*.py"):
        if other != path:
            text = other.read_text()
            assert f"register(core.{name})" not in text and f"[core.{name}] =" not in text, other


def _grad_check(fn, *shapes, dtype=torch.float64):
    xs = [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]
    ys = [x.detach().clone().requires_grad_() for x in xs]
    out, ref = kiln.compile(fn)(*xs), fn(*ys)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)  # sum(dtype=float32) rounds
    out.sum().backward()
    ref.sum().backward()
    for x, y in zip(xs, ys):
        torch.testing.assert_close(x.grad, y.grad)


@pytest.mark.parametrize("fn,shapes", [
    (lambda x: torch.exp(x) + x.exp(), [(3, 5)]),
    (lambda x: torch.sum(x, 1, keepdim=True) * x.sum() + x.sum((0, 1))
     + x.sum(dim=-1, dtype=torch.float32)[:, None].to(x.dtype), [(3, 5)]),
    (lambda a, b: torch.mm(a, b) + a.mm(b), [(3, 4), (4, 2)]),
    (lambda a, b: torch.add(a, b, alpha=2) - torch.sub(b, a) + a.add(b) - a.subtract(b, alpha=0.5) + (a + 1),
     [(3, 4), (4,)]),
], ids=["exp", "sum", "mm", "add"])
def test_op_file_ops_match_eager_with_gradients(fn, shapes):
    torch.manual_seed(0)
    _grad_check(fn, *shapes)


def test_exp_and_add_in_place_spellings():
    def f(x):
        y = x.clone()
        y.exp_()
        torch.exp_(y)
        y.add_(x, alpha=3)
        y += 1
        y.sub_(x)
        y -= x
        return y
    x = torch.randn(4, 3) * 0.1
    torch.testing.assert_close(kiln.compile(f)(x), f(x))


def test_integer_sum_and_exp_promote_as_eager():
    x = torch.randint(-3, 4, (4, 5))
    f = lambda x: (torch.exp(x), x.sum(0), torch.sum(x.bool()))  # noqa: E731
    for a, b in zip(kiln.compile(f)(x), f(x)):
        torch.testing.assert_close(a, b)


def test_mm_under_cpu_autocast_runs_in_the_autocast_dtype():
    a, b = torch.randn(4, 8), torch.randn(8, 3)

    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.mm(a, b)
    out, ref = kiln.compile(f)(a, b), f(a, b)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref)


def test_sum_out_writes_out_in_the_graph():
    """``out=`` is a write of ``out`` for every capture entry (capture/out_arguments.py); it was
    a break before, never a dropped write."""
    def f(x, o):
        torch.sum(x, 0, out=o)
        return o + 1
    x = torch.randn(3, 4)
    o, o2 = torch.empty(4), torch.empty(4)
    torch.testing.assert_close(kiln.compile(f)(x, o2), f(x, o))
    torch.testing.assert_close(o2, o)
    assert kiln.explain(f)(x, torch.empty(4)).graph_break_count == 0


def test_properties_are_flags_on_define_and_stages_read_them():
    assert core.exp.recompute and core.exp.pointwise and core.exp.eager_layout == "follows"
    assert not core.sum.recompute and not core.mm.recompute and core.mm.eager_layout == "contiguous"
    assert prims.mm.library and prims.sum.reduction == "sum" and prims.conv.layout_dependent
    assert not core.eq.differentiable and core.add.differentiable
    # mutation's inverse-view table covers exactly the ops defined as views
    assert set(mutation.SCATTERS) == {op for op in all_ops() if op.view}
    assert ops_with("core", view="shape") == {core.reshape, core.permute, core.transpose, core.expand,
                                              core.unsqueeze, core.squeeze}
    # an op's own autocast property and the name tables never both speak for it
    for op in all_ops("core"):
        if op.autocast is not None:
            assert all(op.name not in t for t in autocast.POLICIES.values()), op


def test_define_refuses_an_unknown_property():
    with pytest.raises(TypeError, match="unknown properties"):
        define("test_ops", "bad", lambda x: x, recomputable=True)
    with pytest.raises(TypeError, match="unknown properties"):
        ops_with(recomputable=True)


def test_a_stage_handle_resolves_table_entries_when_its_stage_binds():
    from kiln.ops import registry

    api = StageAPI("test-stage")
    table = RuleTable("test")
    key = object()
    table[key] = api.make(2)  # recorded: the stage is not bound yet
    assert isinstance(table[key], Deferred)
    with pytest.raises(RuntimeError, match="before its stage was imported"):
        table[key].resolve()

    class Stage:
        @staticmethod
        def make(n):
            return ("rule", n)
    registry._STAGE_APIS["test-stage"] = api
    try:
        registry.bind_stage("test-stage", Stage)
        assert table[key] == ("rule", 2)
        table[object()] = api.make(3)  # bound: registered as the real rule at once
        assert api.make(4) == ("rule", 4)
    finally:
        del registry._STAGE_APIS["test-stage"]
        registry._TABLES.remove(table)


@pytest.mark.parametrize("name", ["log", "sqrt", "rsqrt", "tanh", "sigmoid"])
def test_a_family_file_holds_every_rule_of_its_ops(name):
    from kiln.ops import op_unary_math

    op, prim = getattr(core, name), getattr(prims, name)
    assert name in op_unary_math.FAMILY and op.recompute and op.pointwise
    assert DECOMPOSITIONS[op].__module__ == VJP_RULES[op].__module__ == "kiln.ops.op_unary_math"
    assert prim in LOWERINGS and torch_api.TENSOR_METHODS[name] is not None
    assert torch_api.TENSOR_METHODS[name + "_"] is not None
    x = torch.rand(3, 4, dtype=torch.float64) + 0.5
    _grad_check(lambda x: getattr(torch, name)(x.abs() + 0.5) + getattr(x.abs() + 0.5, name)(), (3, 4))
    y = x.clone()
    f = lambda y: getattr(y.clone(), name + "_")()  # noqa: E731
    torch.testing.assert_close(kiln.compile(f)(y), f(y))


def test_an_unbound_stage_handle_is_no_recipe_for_introspection():
    api = StageAPI("test-introspection")
    assert not hasattr(api, "__wrapped__") and not hasattr(api.rule, "__qualname__")
