"""Hooks on submodules called inside a traced frame (kiln/capture/module_call.py).

Forward pre-hooks and forward hooks (with or without kwargs, prepended, always_call, global)
are inlined around the submodule's forward in ``nn.Module._call_impl``'s order: every test
compares with eager on fresh inputs and asserts no graph break. Backward hooks, and a hook
that breaks, stay outside the graph: the module is called for real with its hooks, its
forward compiled on its own."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as nn_module

import kiln


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        return torch.tanh(self.lin(x)) * scale


class Net(nn.Module):
    def __init__(self, n=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(n)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x) + x
        return x


def _check(net, compiled, breaks=0):
    for _ in range(2):  # the second call runs the cached entry (its guards pass)
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x), net(x))
    stats = kiln.stats()
    assert stats["graph_breaks"] == breaks, stats
    assert stats["eager_runs"] == 0 and stats["fallbacks"] == 0, stats
    assert stats["kernels_generated"] > 0, stats


def test_pre_hook_replaces_input_and_forward_hook_replaces_output():
    net = Net()
    net.blocks[0].register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    net.blocks[1].register_forward_pre_hook(lambda m, args: args[0] - 1)  # not a tuple: (x,)
    net.blocks[1].register_forward_hook(lambda m, args, out: out * args[0].sum())
    net.blocks[0].register_forward_hook(lambda m, args, out: None)  # None keeps the output
    _check(net, kiln.compile(net))


def test_with_kwargs_hooks_and_order():
    class Caller(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x, scale=2.0)

    net = Caller()
    order = []

    def pre_kw(m, args, kwargs):
        order.append("pre_kw")
        return (args[0] + 1,), {**kwargs, "scale": kwargs["scale"] * 3}

    def pre_in_place(m, args, kwargs):  # writes into the call's own kwargs dict
        order.append("pre_in_place")
        kwargs["scale"] = kwargs["scale"] + 1

    def post_kw(m, args, kwargs, out):
        order.append("post_kw")
        return out + kwargs["scale"]

    def first(m, args, out):
        order.append("first")

    net.block.register_forward_pre_hook(pre_kw, with_kwargs=True)
    net.block.register_forward_pre_hook(pre_in_place, with_kwargs=True)
    net.block.register_forward_hook(post_kw, with_kwargs=True, always_call=True)
    net.block.register_forward_hook(first, prepend=True)
    x = torch.randn(3, 4)
    want = net(x)
    eager_order = list(order)
    order.clear()
    compiled = kiln.compile(net)
    torch.testing.assert_close(compiled(x), want)
    assert order == eager_order == ["pre_kw", "pre_in_place", "first", "post_kw"]
    _check(net, compiled)


def test_hook_closing_over_python_state_replays_its_side_effect():
    net = Net()
    count = 0
    seen = []

    def counting(m, args, out):
        nonlocal count
        count += 1
        seen.append(type(m).__name__)
        return out * 0.5

    for block in net.blocks:
        block.register_forward_hook(counting)
    compiled = kiln.compile(net)
    x = torch.randn(3, 4)
    want = net(x)
    assert count == 2
    for calls in (1, 2, 3):
        torch.testing.assert_close(compiled(x), want)
        assert count == 2 + 2 * calls  # each compiled call counts both blocks, as eager does
    assert seen == ["Block"] * 8
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["eager_runs"] == 0


def test_hook_added_after_compiling_recompiles_and_removed_hook_is_dropped():
    net = Net()
    compiled = kiln.compile(net)
    _check(net, compiled)
    assert kiln.stats()["frames_compiled"] == 1
    handle = net.blocks[1].register_forward_hook(lambda m, args, out: out + 10)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), net(x))  # the guard on the hook table failed
    assert kiln.stats()["frames_compiled"] == 2
    handle.remove()
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), net(x))  # the first entry again, no new compile
    assert kiln.stats()["frames_compiled"] == 2
    pre = net.blocks[0].register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), net(x))
    pre.remove()
    assert kiln.stats()["graph_breaks"] == 0


def test_identical_blocks_with_the_same_hook_share_one_entry():
    # hook ids differ per registration; the guards read the tables' structure, not the ids
    blocks = [Block() for _ in range(3)]
    for b in blocks:
        b.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    compiled = kiln.compile(lambda blk, x: blk(x) + 1)
    for b in blocks:
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(b, x), b(x) + 1)
    assert kiln.stats()["frames_compiled"] == 1


def test_global_forward_hooks_run_on_submodules():
    net = Net()
    compiled = kiln.compile(net)
    _check(net, compiled)
    calls = []

    def global_hook(m, args, out):
        calls.append(type(m).__name__)
        return out * 2 if isinstance(m, Block) else None

    handle = nn_module.register_module_forward_hook(global_hook)
    try:
        x = torch.randn(3, 4)
        want = net(x)
        eager_calls = list(calls)
        calls.clear()
        torch.testing.assert_close(compiled(x), want)  # a new entry: the global table changed
        assert calls == eager_calls == ["Linear", "Block", "Linear", "Block", "Net"]
    finally:
        handle.remove()
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), net(x))
    assert kiln.stats()["graph_breaks"] == 0


def test_backward_hook_breaks_with_a_reason_and_still_runs():
    net = Net()
    got = []
    net.blocks[1].register_full_backward_hook(lambda m, gin, gout: got.append(gout[0].clone()))
    x = torch.randn(3, 4, requires_grad=True)
    net(x).sum().backward()
    want_hook, want_grad = got.pop(), x.grad.clone()
    x.grad = None
    compiled = kiln.compile(net)
    compiled(x).sum().backward()
    torch.testing.assert_close(got.pop(), want_hook)
    torch.testing.assert_close(x.grad, want_grad)
    stats = kiln.stats()
    assert stats["graph_breaks"] >= 1 and stats["eager_runs"] == 0, stats
    assert stats["kernels_generated"] > 0  # the hooked block's forward is compiled on its own
    report = kiln.explain(net)(torch.randn(3, 4))
    assert "backward hooks are registered" in str(report), str(report)


def test_hook_that_breaks_runs_once_around_the_compiled_forward():
    # the break happens inside the hook: the glue calls the block for real (hooks included),
    # with its forward compiled; the hook's effect is applied exactly once
    net = Net()
    runs = []

    def breaking(m, args):
        runs.append(1)
        kiln.graph_break()
        return (args[0] * 3,)

    net.blocks[1].register_forward_pre_hook(breaking)
    compiled = kiln.compile(net)
    for _ in range(2):
        x = torch.randn(3, 4)
        runs.clear()
        want = net(x)
        assert runs == [1]
        runs.clear()
        torch.testing.assert_close(compiled(x), want)
        assert runs == [1]
    stats = kiln.stats()
    assert stats["graph_breaks"] >= 1 and stats["eager_runs"] == 0, stats


def test_fullgraph_with_hooks_has_no_break():
    net = Net()
    net.blocks[0].register_forward_hook(lambda m, args, out: F.relu(out))
    compiled = kiln.compile(net, fullgraph=True)
    _check(net, compiled)


@pytest.mark.parametrize("training", [True, False])
def test_hooks_under_training_and_gradients(training):
    net = Net().train(training)
    net.blocks[0].register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    net.blocks[1].register_forward_hook(lambda m, args, out: out ** 2)
    compiled = kiln.compile(net)
    x = torch.randn(3, 4)
    compiled(x).sum().backward()
    got = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net(x).sum().backward()
    for g, p in zip(got, net.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert kiln.stats()["graph_breaks"] == 0


def test_closure_called_twice_in_one_trace_sees_its_own_write():
    # one tracker per real closure cell: the second call reads what the first call wrote
    n = 0

    def bump(x):
        nonlocal n
        n += 1
        return x * n

    compiled = kiln.compile(lambda x: bump(x) + bump(x))
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 1 + x * 2)
    assert n == 2
    assert kiln.stats()["graph_breaks"] == 0


class _Base(nn.Module):
    def forward(self, x):
        return x * 2


def test_class_a_library_made_over_a_user_class_resolves_like_the_user_class():
    # FSDP2's fully_shard makes ``FSDP<Block>`` (in torch's module) over the user's class;
    # transformers' layers compare ``type(self).forward`` with their own wrapper
    made = type("FSDPBase", (_Base,), {"__module__": "torch.distributed.made_here"})

    def f(m, x):
        return m(x) + 1 if type(m).forward is _Base.forward else m(x) - 1

    m = made()
    compiled = kiln.compile(f)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(m, x), f(m, x))
    assert kiln.stats()["graph_breaks"] == 0


def test_compiled_layers_inside_a_compiled_root_are_traced_into_its_graph():
    net = Net(3)
    for i, block in enumerate(net.blocks):
        net.blocks[i] = kiln.compile(block)
    net.blocks[1]._orig_mod.register_forward_hook(lambda m, args, out: out * 2)
    compiled = kiln.compile(net)
    x = torch.randn(3, 4)
    got = compiled(x)
    assert kiln.stats()["frames_compiled"] == 1  # the root's graph holds the layers
    torch.testing.assert_close(got, net(x))  # (the eager call compiles the layers on their own)
    _check(net, compiled)


def test_hooks_on_a_compiled_layer_wrapper_break_and_run_once():
    net = Net()
    net.blocks[0] = kiln.compile(net.blocks[0])
    runs = []
    net.blocks[0].register_forward_hook(lambda m, args, out: runs.append(1) or out + 1)
    compiled = kiln.compile(net)
    for _ in range(2):
        x = torch.randn(3, 4)
        want = net(x)
        runs.clear()
        torch.testing.assert_close(compiled(x), want)
        assert runs == [1]
    stats = kiln.stats()
    assert stats["graph_breaks"] == 1 and stats["eager_runs"] == 0, stats


def test_pre_hook_returning_a_named_tuple_gives_its_items_as_arguments():
    import collections
    Pair = collections.namedtuple("Pair", "x")
    net = Net()
    net.blocks[0].register_forward_pre_hook(lambda m, args: Pair(args[0] + 1))
    _check(net, kiln.compile(net))


def test_dynamo_also_traces_these_hooks_without_a_break():
    # the peer's figure for the hook cases above: 0 breaks, as kiln asserts
    import torch._dynamo
    net = Net()
    net.blocks[0].register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    net.blocks[1].register_forward_hook(lambda m, args, kwargs, out: out + 1, with_kwargs=True)
    torch._dynamo.reset()
    report = torch._dynamo.explain(net)(torch.randn(3, 4))
    assert report.graph_break_count == 0
    _check(net, kiln.compile(net))


def test_callable_object_and_partial_as_hooks():
    import functools

    class Recorder:  # a callable object holding state: its writes are replayed
        def __init__(self):
            self.calls = 0

        def __call__(self, m, args, out):
            self.calls += 1
            return out * 2

    def scaled(k, m, args):
        return (args[0] * k,)

    net = Net()
    rec = Recorder()
    net.blocks[0].register_forward_hook(rec)
    net.blocks[1].register_forward_pre_hook(functools.partial(scaled, 3.0))
    compiled = kiln.compile(net)
    x = torch.randn(3, 4)
    want = net(x)
    torch.testing.assert_close(compiled(x), want)
    torch.testing.assert_close(compiled(x), want)
    assert rec.calls == 3
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["eager_runs"] == 0
