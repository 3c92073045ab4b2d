"""torch.einsum: common patterns become core.einsum (a bmm for float contractions, a broadcast
multiply for outer products), a repeated letter stays a fallback node (or a graph break when a
gradient is needed), and every form matches eager. The op table runs the patterns every way."""
import pytest
import torch

import kiln
from kiln.capture import trace
from kiln.graph.propagate import propagate_meta
from kiln.ops import core, prims
from kiln.ops.decompose import decompose
from testing import assert_close


def _targets(fn, args):
    graph = trace(fn, args).graph
    return graph, [n.target for n in graph.calls]


def test_contraction_is_one_bmm_and_outer_product_is_pointwise():
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    graph, targets = _targets(lambda a, b: torch.einsum("bij,bjk->bik", a, b), (a, b))
    assert targets == [core.einsum]
    prim_targets = [n.target for n in decompose(propagate_meta(graph)).calls]
    assert prim_targets.count(prims.bmm) == 1
    graph, _ = _targets(lambda a, b: torch.einsum("i,j->ij", a, b), (a[0, 0], b[0, 0]))
    prim_targets = [n.target for n in decompose(propagate_meta(graph)).calls]
    assert prims.bmm not in prim_targets and prims.mul in prim_targets


def test_three_operands_contract_pairwise():
    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5, 2)
    _, targets = _targets(lambda a, b, c: torch.einsum("ij,jk,kl->il", a, b, c), (a, b, c))
    assert targets == [core.einsum, core.einsum]


@pytest.mark.parametrize("eq", ["ii->i", "ii", "bii->b"])
def test_repeated_letter_is_a_fallback_and_matches(eq):
    x = torch.randn(2, 4, 4) if eq.startswith("b") else torch.randn(4, 4)
    fn = lambda x: torch.einsum(eq, x * 2) + 1  # noqa: E731
    _, targets = _targets(fn, (x,))
    assert core.fallback in targets and core.einsum not in targets
    assert_close(kiln.compile(fn, fullgraph=True)(x), fn(x))


def test_repeated_letter_needing_grad_is_a_graph_break_not_a_wrong_answer():
    x = torch.randn(4, 4, requires_grad=True)
    fn = lambda x: torch.einsum("ii->i", x * 2).sum()  # noqa: E731
    out = kiln.compile(fn)(x)
    assert kiln.stats()["graph_breaks"] >= 1
    out.backward()
    assert_close(x.grad, 2 * torch.eye(4))


def test_list_operands_and_spaces():
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    fn = lambda a, b: torch.einsum("ij, jk -> ki", [a, b])  # noqa: E731
    assert_close(kiln.compile(fn, fullgraph=True)(a, b), fn(a, b))


def test_wrong_subscript_count_raises_like_eager():
    fn = lambda a: torch.einsum("ijk->i", a)  # noqa: E731
    a = torch.randn(3, 4)
    with pytest.raises(RuntimeError):
        fn(a)
    with pytest.raises(RuntimeError):
        kiln.compile(fn, fullgraph=True)(a)
