"""Graph breaks inside ``for`` loops resume inside the loop (capture/resume_loops.py): each piece
between two breaks is a compiled graph, one resume function serves every iteration, and a
second call compiles nothing. Each case runs eagerly and compiled (backends eager and kiln) on
fresh random inputs and must match eager (outputs, printed text, appended lists); its graph and
break counts are what ``kiln.explain`` reports. Loops kiln cannot resume inside (a while loop,
a generator, an iterator also held by a local) keep running their rest eagerly, with the
reason logged on the ``graph_breaks`` channel."""
import sys

import pytest
import torch
from torch import nn

import kiln
from kiln import api, log
from kiln.capture.resume_loops import starts_in_loop
from tests.capture.resume_helpers import BACKENDS, check_break, randn, run_both

CASES = []


def case(graphs, breaks, args=lambda: (randn(4, 8),), specializes=False):
    def deco(fn):
        CASES.append(pytest.param(fn, args, graphs, breaks, specializes, id=getattr(fn, "__name__", None)))
        return fn
    return deco


# ---------------------------------------------------------------- the loop kinds
# The counts are compiles: an entry of the loop's resume function serves every iteration its
# guards accept. Here: the frame (iteration 0 up to the print); the resume function with i
# == 1 read after the break (a constant), then with i symbolic (automatic dynamic int), then
# the last iteration (no items left: the loop exits, no break).
@case(4, 3)
def print_in_a_range_loop(x):
    y = x + 1
    for i in range(4):
        y = y.sin() * 2
        print("step", i)
        y = y - 1
    return y.sum(0)


LAYERS = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])


# the layers share the loop's resume function's entries (modules are guarded by type); the
# float ``scale`` is a constant in the first, and a graph input once it changed (the second)
@case(4, 3, args=lambda: (randn(4, 8), LAYERS))
def item_in_a_module_list_loop(x, layers):
    scale = 1.0
    for layer in layers:
        x = layer(x).tanh()
        scale = scale + x.mean().item()
    return x * scale


# means 4..5: the branches go T F T F; the frame, then the resume functions of either branch
# with items left, and the false branch's with none
@case(4, 3, args=lambda: (torch.rand(4, 8) + 4,))
def data_dependent_if_in_a_loop(x):
    for _ in range(4):
        x = x * 0.5
        if x.mean() > 1.5:
            x = x.relu() + 0
        else:
            x = x * 4
    return x - 1


@case(4, 3, args=lambda: (randn(4, 8), randn(4, 8)))
def zip_and_enumerate_loop(x, y):
    out = x
    for i, (a, b) in enumerate(zip([x, y, x + y], [y, x, x * y])):
        out = out + a * b * i
        kiln.graph_break()
        out = out.tanh()
    return out


# a loop index is a constant at 0, then (it changed) a symbol from 1 on (test_dynamic_ints.py)
@case(6, 5)
def nested_loops_break_in_the_inner(x):
    for i in range(3):
        for j in range(2):
            x = x * 1.1 + j
            print("inner", i, j)
        x = x - i
    return x


@case(4, 3)
def nested_loops_break_in_the_outer(x):
    for i in range(3):
        for j in range(2):
            x = x * 1.1 + j
        kiln.graph_break()
        x = x - i
    return x


# the frame; i == 0 (a constant); i odd in 1..5, i even >= 2 (symbolic, from the first change
# on); i == 7 leaves the loop
@case(5, 4)
def break_and_continue(x):
    for i in range(10):
        x = x + 1
        kiln.graph_break()
        if i % 2 == 0:
            continue
        if i > 5:
            break
        x = x * 1.5
    else:
        x = x * 100
    return x


@case(3, 2)
def for_else_runs_after_the_last_break(x):
    for t in (x, x * 2):
        x = x + t
        kiln.graph_break()
    else:
        x = x * 3
    return x


@case(4, 3)
def return_from_inside_the_loop(x):
    for i in range(6):
        x = x + 1
        kiln.graph_break()
        if i == 3:
            return x * 10
    return x


@case(5, 4, args=lambda: (randn(4, 8), []))
def appends_to_lists_made_before_the_loop(x, seen):
    outs = []
    for i in range(4):
        x = x.cos()
        outs.append(x)
        seen.append(i)
        kiln.graph_break()
    return torch.stack(outs).sum(0)


def _helper_breaks(t):
    t = t * 2
    kiln.graph_break()
    return t + 1


# the frame computes nothing before the call (no graph); the helper is compiled on its own
# (two graphs, its own break) once: the glues of the frame and of the resume function share
# its entries (explain's private caches are one family by code, as a plain compile's are);
# the resume function with items left, and without
@case(4, 3)
def break_in_a_callee_called_in_a_loop(x):
    for _ in range(3):
        x = _helper_breaks(x).sin()
    return x


@case(3, 2, args=lambda: (randn(4, 8, grad=True),))
def no_grad_block_inside_the_loop(x):
    for _ in range(3):
        with torch.no_grad():
            x = x * 2
            kiln.graph_break()
            x = x + 1
        x = x.sin()
    return x


class LayerStack(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
            kiln.graph_break()
            x = torch.relu(x)
        return x


case(3, 2)(LayerStack())  # the three layers share the loop resume function's entry


def _make_closure():
    k = 3.0

    def closure_with_a_loop(x):
        for _ in range(4):
            x = x * k
            kiln.graph_break()
        return x
    return closure_with_a_loop


case(3, 2)(_make_closure())  # the frame, the resume function with items left and without


# ---------------------------------------------------------------- loops that stay eager after a break
def _gen(t):
    for k in range(3):
        yield t * k


@case(1, 1)  # the generator ran at its call: its items are in the prefix graph
def loop_over_a_generator(x):
    for y in _gen(x):
        x = x + y
        kiln.graph_break()
    return x


@case(0, 1)  # nothing before the while loop: no prefix graph
def break_in_a_while_loop_holding_a_for_loop(x):
    n = 0
    while n < 2:
        for i in range(2):
            x = x + i
            kiln.graph_break()
        n += 1
    return x


@case(1, 1)
def loop_iterator_also_held_by_a_local(x):
    x = x * 2
    it = iter([1, 2, 3, 4])
    for a in it:
        x = x + a
        kiln.graph_break()
        next(it, None)
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,args,graphs,breaks,specializes", CASES)
def test_loop_break(fn, args, graphs, breaks, specializes, backend, capsys):
    check_break(fn, args, capsys, backend, graphs=graphs, breaks=breaks, specializes=specializes)


# ---------------------------------------------------------------- the example
def example(x, layers):
    for layer in layers:
        x = layer(x).relu()
        print("step")
        x = x * 2
    return x + 1


def test_example_compiles_every_piece_after_the_first_iteration(capsys):
    layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
    x = randn(4, 8)
    explained = kiln.explain(example, backend="eager")(x, layers)
    # before: 0 graphs, 1 break (the whole loop ran eagerly); then one graph per layer, now one
    # for every layer (modules are guarded by type and structure, not identity)
    assert (explained.graph_count, explained.graph_break_count) == (3, 2), explained
    # linear + relu before the first print; * 2, linear, relu between prints; * 2 and + 1 at the end
    assert explained.ops_per_graph == [2, 3, 2], explained.ops_per_graph
    for b in explained.break_reasons:
        assert "print" in b.reason and b.filename == __file__ and b.source_line == 'print("step")', b
    kiln.reset()
    compiled = kiln.compile(example)
    run_both(example, compiled, (x, layers), capsys)
    stats = kiln.stats()
    assert stats["graphs_compiled"] == 3 and stats["frames_compiled"] == 3, stats
    assert stats["kernels_generated"] > 0 and stats["fallbacks"] == 0, stats
    # one resume function for the four iterations: the frame and one loop resume code
    codes = [k for k, _ in api._CODE_CACHES if k.co_name.startswith("example")]
    assert len(codes) == 2 and sum(starts_in_loop(c) for c in codes) == 1, codes
    run_both(example, compiled, (randn(4, 8), layers), capsys)
    again = kiln.stats()
    assert again["frames_compiled"] == 3 and again["recompiles"] == stats["recompiles"], again


def test_kiln_backend_compiles_kernels_for_each_piece(capsys):
    layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
    explained = kiln.explain(example, backend="kiln")(randn(4, 8), layers)
    capsys.readouterr()
    assert explained.graph_count == 3 and all(n > 0 for n in explained.ops_per_graph)
    assert explained.kernel_count >= 3, explained


# ---------------------------------------------------------------- compiles stay bounded
def _range_loop(x, n):
    for i in range(n):
        x = x * 0.5 + 1
        kiln.graph_break()
    return x.sum(0)


@pytest.mark.parametrize("n", [10, 40])
def test_compiles_do_not_grow_with_the_iteration_count(n, capsys):
    compiled = kiln.compile(_range_loop)
    run_both(_range_loop, compiled, (randn(4, 8), n), capsys)
    # the frame, the loop's resume function for "more items" and for "the last one"
    assert kiln.stats()["frames_compiled"] == 3, kiln.stats()
    hits = kiln.stats()["cache_hits"]
    run_both(_range_loop, compiled, (randn(4, 8), n), capsys)
    assert kiln.stats()["frames_compiled"] == 3 and kiln.stats()["cache_hits"] == hits + n + 1


def test_a_long_loop_does_not_nest_python_calls(capsys):
    compiled = kiln.compile(_range_loop)
    limit = sys.getrecursionlimit()
    run_both(_range_loop, compiled, (randn(4, 8), 3 * limit), capsys)
    assert kiln.stats()["frames_compiled"] == 3


def _deep(x, layers):
    for layer in layers:
        x = layer(x)
        kiln.graph_break()
    return x


def test_identical_layers_share_one_entry(capsys):
    layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(12)])
    compiled = kiln.compile(_deep)
    run_both(_deep, compiled, (randn(4, 8), layers), capsys)
    stats = kiln.stats()
    # the frame, the loop's resume function with layers left, and with none
    assert stats["frames_compiled"] == 3 and stats["fallbacks"] == 0, stats


def test_one_entry_per_layer_past_the_recompile_limit(capsys):
    # twelve layer classes: modules are guarded by type, so each needs an entry of its own
    layers = nn.ModuleList([type(f"Linear{i}", (nn.Linear,), {})(8, 8) for i in range(12)])
    compiled = kiln.compile(_deep)
    run_both(_deep, compiled, (randn(4, 8), layers), capsys)
    stats = kiln.stats()
    assert stats["frames_compiled"] == 13 and stats["fallbacks"] == 0, stats
    assert not [c for c in api._CODE_CACHES.values() if c.eager_reason]
    with kiln.config.patch(loop_resume_limit=4):  # past the limit the rest of the loop runs eagerly
        kiln.reset()
        compiled = kiln.compile(_deep)
        run_both(_deep, compiled, (randn(4, 8), layers), capsys)
        assert [c for c in api._CODE_CACHES.values() if c.eager_reason]


# ---------------------------------------------------------------- reasons, explain, fullgraph
def test_fallbacks_log_their_reason(capsys):
    log.configure("graph_breaks")
    try:
        for fn in (loop_over_a_generator, break_in_a_while_loop_holding_a_for_loop,
                   loop_iterator_also_held_by_a_local):
            x = randn(4, 8)
            torch.testing.assert_close(kiln.compile(fn)(x), fn(x))
    finally:
        log.configure("")
    err = capsys.readouterr().err
    assert "cannot resume inside the loop (the loop runs over a generator)" in err
    assert "inside a loop (a while loop holds it)" in err
    assert "cannot resume inside the loop (the loop's iterator is also held by another value)" in err
    assert err.count("the rest of the frame runs eagerly") >= 3


def test_explain_reports_every_break_with_its_line(capsys):
    explained = kiln.explain(nested_loops_break_in_the_inner, backend="eager")(randn(4, 8))
    capsys.readouterr()
    assert explained.graph_break_count == 5
    assert {(b.filename, b.source_line) for b in explained.break_reasons} == \
        {(__file__, 'print("inner", i, j)')}


def test_fullgraph_raises_at_the_first_break():
    with pytest.raises(kiln.GraphBreakError, match=r"print.*test_loop_breaks.py:\d+: print\(\"step\", i\)"):
        kiln.compile(print_in_a_range_loop, fullgraph=True)(randn(4, 8))


# ---------------------------------------------------------------- what a resume function guards
def test_the_loop_rest_is_guarded_only_as_far_as_for_iter_read_it(capsys):
    explained = kiln.explain(_range_loop, backend="eager")(randn(4, 8), 50)
    capsys.readouterr()
    lengths = sorted({g.split(")")[1].strip() for g in explained.guards if g.startswith("len(") and ".items" in g})
    assert lengths == ["== 0", "> 0"], lengths  # never the 49 items left: one entry for all of them
    assert not [g for g in explained.guards if ".items[" in g]  # the unused index is never read


def test_other_uses_of_a_loop_rest_see_every_item():
    from kiln.capture.resume_loops import LoopRest

    def consume(x, it):
        rest = list(it)
        return x + sum(rest), type(it).__name__

    x = randn(3)
    compiled = kiln.compile(consume)
    for items in ((1, 2, 3), (1, 2, 3), (4, 5)):
        got, want = compiled(x, LoopRest(items)), consume(x, LoopRest(items))
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] == "LoopRest"
    assert kiln.stats()["frames_compiled"] == 2  # the length is guarded exactly here
