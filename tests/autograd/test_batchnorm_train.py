"""Training-mode batch norm with running statistics compiles: the output uses batch statistics,
running_mean / running_var / num_batches_tracked are written back to the module's buffers, and
gradients through loss.backward() match eager."""
import copy

import pytest
import torch
import torch.nn as nn

import kiln
from testing import TARGETS, assert_close, on_target

BACKENDS = ["eager", "aot_eager", "kiln"]


def _net(bn):
    torch.manual_seed(0)
    if bn is nn.BatchNorm1d:
        return nn.Sequential(nn.Linear(5, 4), bn(4, momentum=0.3), nn.ReLU(inplace=True))
    return nn.Sequential(nn.Conv2d(3, 4, 3), bn(4), nn.ReLU(inplace=True))


def _input(bn, dtype=torch.float32, layout="contiguous"):
    if bn is nn.BatchNorm1d:
        return torch.randn(6, 5).to(dtype)
    x = torch.randn(2, 3, 6, 6).to(dtype)
    return x.transpose(2, 3) if layout == "transposed" else x


def _train_steps(net, bn, backend, steps=2, dtype=torch.float32, layout="contiguous"):
    ref = copy.deepcopy(net)
    compiled = kiln.compile(net, backend=backend, fullgraph=True)
    for _ in range(steps):
        x = _input(bn, dtype, layout)
        out, expected = compiled(x), ref(x)
        assert_close(out, expected, dtype)
        out.square().mean().backward()
        expected.square().mean().backward()
        for (name, b), (_, rb) in zip(net.named_buffers(), ref.named_buffers()):
            assert_close(b, rb, dtype if b.is_floating_point() else None), name
        for (name, p), (_, rp) in zip(net.named_parameters(), ref.named_parameters()):
            assert_close(p.grad, rp.grad, dtype), name
    return net


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bn", [nn.BatchNorm1d, nn.BatchNorm2d])
def test_train_step_updates_running_stats(backend, bn):
    net = _train_steps(_net(bn).train(), bn, backend)
    assert net[1].num_batches_tracked.item() == 2
    assert kiln.stats()["graph_breaks"] == 0


def test_noncontiguous_input():
    _train_steps(_net(nn.BatchNorm2d).train(), nn.BatchNorm2d, "kiln", layout="transposed")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_module(dtype):
    net = _net(nn.BatchNorm1d).to(dtype).train()
    _train_steps(net, nn.BatchNorm1d, "kiln", steps=1, dtype=dtype)


@pytest.mark.parametrize("target", TARGETS)
def test_targets(target):
    with on_target(target):
        _train_steps(_net(nn.BatchNorm1d).train(), nn.BatchNorm1d, "kiln", steps=1)


def test_no_grad_forward_still_updates_stats():
    net = _net(nn.BatchNorm1d).train()
    ref = copy.deepcopy(net)
    compiled = kiln.compile(net, fullgraph=True)
    x = _input(nn.BatchNorm1d)
    with torch.no_grad():
        assert_close(compiled(x), ref(x))
    assert_close(net[1].running_var, ref[1].running_var)


def test_eval_after_train_uses_the_updated_stats():
    net = _net(nn.BatchNorm1d).train()
    ref = copy.deepcopy(net)
    compiled = kiln.compile(net, fullgraph=True)
    x = _input(nn.BatchNorm1d)
    compiled(x), ref(x)
    net.eval(), ref.eval()
    assert_close(compiled(x), ref(x))  # the training guard fails: a second entry for eval
    assert kiln.stats()["recompiles"] == 1


def test_momentum_none_is_a_graph_break_that_matches_eager():
    net = nn.BatchNorm1d(3, momentum=None).train()
    ref = copy.deepcopy(net)
    x = torch.randn(4, 3)
    assert_close(kiln.compile(net)(x), ref(x))
    assert_close(net.running_mean, ref.running_mean)
    assert kiln.stats()["graph_breaks"] == 1


def test_batch_of_one_raises_like_eager():
    net = nn.BatchNorm1d(3).train()
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        kiln.compile(net)(torch.randn(1, 3))
