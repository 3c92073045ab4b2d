"""The options a PyTorch user compiles, for every torch.optim optimizer kiln inlines
(kiln/capture/torch_optim.py), single-tensor and foreach: parameters and state match eager over
several steps, one graph per step and no break. What kiln does not capture (RAdam's branch on
its step count, ``fused=True``) is a break with its reason, and still eager's answer.
The table of results is docs/notes/session-38-optim.md."""
import warnings

import pytest
import torch

import kiln
from test_optimizer_step import _pair, _steps

VARIANTS = [
    ("SGD", dict(momentum=0.9, nesterov=True)),
    ("SGD", dict(momentum=0.9, dampening=0.1, weight_decay=0.1, maximize=True)),
    ("Adam", dict(weight_decay=0.1, maximize=True)),
    ("AdamW", dict(amsgrad=True, weight_decay=0.1)),
    ("RMSprop", {}),
    ("RMSprop", dict(centered=True, momentum=0.9, weight_decay=0.1)),
    ("RMSprop", dict(maximize=True)),
    ("Adagrad", {}),
    ("Adagrad", dict(lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1, maximize=True)),
    ("Adamax", {}),
    ("Adamax", dict(weight_decay=0.1, maximize=True)),
    ("NAdam", {}),
    ("NAdam", dict(weight_decay=0.1, decoupled_weight_decay=True)),
    ("NAdam", dict(weight_decay=0.1, momentum_decay=0.01, maximize=True)),
]


def _id(case):
    name, kw = case
    return name + "".join(f"-{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("name,kw", VARIANTS, ids=[_id(c) for c in VARIANTS])
def test_variant_matches_eager_in_one_graph(name, kw, foreach):
    m, o, m2, o2 = _pair(name, foreach=foreach, **kw)
    _steps(m, o, m2, o2, kiln.compile(o2.step), 4)
    stats = kiln.stats()
    # at most two entries: the first step (state made; Adagrad makes it in __init__) and the
    # steady state
    assert stats["frames_compiled"] <= 2 and (stats["graph_breaks"], stats["eager_runs"]) == (0, 0), stats
    e = kiln.explain(o2.step)()
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons


def _explained_break(name, kw, reason):
    m, o, m2, o2 = _pair(name, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _steps(m, o, m2, o2, kiln.compile(o2.step), 4)
        e = kiln.explain(o2.step)()
    assert e.graph_break_count >= 1
    assert any(reason in str(r) for r in e.break_reasons), e.break_reasons


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
def test_radam_branches_on_its_step_count_a_break_with_eager_answer(foreach):
    """RAdam's ``if rho_t > 5`` reads the step count, a tensor while compiling
    (``_get_value``): a data-dependent branch, so the step runs eagerly."""
    _explained_break("RAdam", dict(foreach=foreach), "data-dependent branch")


@pytest.mark.parametrize("name,kw", [("Adam", {}), ("AdamW", dict(amsgrad=True)),
                                     ("SGD", dict(momentum=0.9)), ("Adagrad", {})])
def test_fused_is_an_explained_break_with_eager_answer(name, kw):
    """``fused=True`` on CPU calls ``torch._fused_adam_`` (and its siblings), one kernel that
    writes lists of tensors in place: not in the capture table, a break naming it. Once Dynamo
    has run in the process, torch's Python ``_fused_adam`` is ``torch.compiler.disable``d ("don't
    trace into fused optimizer"): a break naming that function instead."""
    _explained_break(name, dict(fused=True, **kw), "_fused_")


@pytest.mark.parametrize("name", ["Adam", "RMSprop", "Adagrad", "Adamax", "NAdam"])
def test_a_scheduler_changing_a_float_lr_compiles_twice_not_every_step(name):
    """``lr_scheduler`` between steps changes the float lr each step: the first change makes lr
    a graph input (automatic dynamic floats), later steps reuse that entry."""
    m, o, m2, o2 = _pair(name, foreach=False)
    scheds = [torch.optim.lr_scheduler.ExponentialLR(opt, 0.9) for opt in (o, o2)]
    step = kiln.compile(o2.step)

    def sched_step(i):
        if i:
            for s in scheds:
                s.step()
    _steps(m, o, m2, o2, step, 6, sched_step)
    stats = kiln.stats()
    assert stats["frames_compiled"] <= 3 and stats["graph_breaks"] == 0, stats


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("name", ["RMSprop", "Adagrad", "Adamax", "NAdam"])
def test_a_tensor_lr_with_a_scheduler_is_one_entry(name, foreach):
    """``lr=torch.tensor(...)`` changed by a scheduler is a graph input from the start
    (RMSprop's foreach ``_foreach_addcdiv_(..., value=-lr)`` takes the 0-d tensor as its number)."""
    m, o, m2, o2 = _pair(name, foreach=foreach)
    for opt in (o, o2):
        opt.param_groups[0]["lr"] = torch.tensor(0.01)
    scheds = [torch.optim.lr_scheduler.LinearLR(opt, total_iters=4) for opt in (o, o2)]

    def sched_step(i):
        if i:
            for s in scheds:
                s.step()
    _steps(m, o, m2, o2, kiln.compile(o2.step), 5, sched_step)
    stats = kiln.stats()
    assert stats["frames_compiled"] <= 2 and (stats["graph_breaks"], stats["eager_runs"]) == (0, 0), stats


@pytest.mark.parametrize("name,kw", [("RAdam", {}), ("Adam", dict(fused=True))], ids=["RAdam", "fused"])
def test_a_break_under_an_lr_scheduler_calls_the_step_bound_to_its_optimizer(name, kw):
    """A scheduler's step wrapper calls ``func.__get__(opt, cls)(*args)``; where the step
    breaks, the glue runs that call eagerly with the bound method rebuilt as bound (it was
    rebuilt as the bare function, and ``self, *_ = args`` raised ValueError)."""
    m, o, m2, o2 = _pair(name, **kw)
    scheds = [torch.optim.lr_scheduler.StepLR(opt, 1, 0.5) for opt in (o, o2)]

    def sched_step(i):
        if i:
            for s in scheds:
                s.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _steps(m, o, m2, o2, kiln.compile(o2.step), 4, sched_step)
    assert kiln.stats()["graph_breaks"] >= 1
