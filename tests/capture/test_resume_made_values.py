"""Values made in the traced code before a graph break and live across it are rebuilt by the
glue, so the rest resumes in compiled code instead of the whole function running eagerly:
a transformers ModelOutput (a dict dataclass), a set, a functools.partial, and a view of an
intermediate tensor that nothing else sees, and a view of an input (taken again from the real
input), views of one intermediate live together (taken again from their base, a prefix output).
A view whose aliasing in eager kiln does not know still makes that part eager, correctly."""
import functools

import pytest
import torch

import kiln
from resume_helpers import BACKENDS, check_break, randn

transformers = pytest.importorskip("transformers")


def _model_output_live(x):
    out = transformers.modeling_outputs.BaseModelOutput(last_hidden_state=x * 2, hidden_states=(x + 1,))
    kiln.graph_break()
    return out.last_hidden_state + out.hidden_states[0]


def _set_and_partial_live(x):
    seen = {1, 2}
    scale = functools.partial(torch.mul, other=3.0)
    y = x.sin()
    kiln.graph_break()
    return scale(y), seen  # the set is passed on to the resume function as it is


def _intermediate_view_live(x):
    h = (x * 2).view(2, -1)[:, 1:]
    kiln.graph_break()
    return h.cos() + 1


def _input_view_live(x):
    h = x[1:]
    kiln.graph_break()
    x.mul_(2)  # the view must see the write: this part cannot pass h as a copy
    return h + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_output_across_break(backend, capsys):
    check_break(_model_output_live, lambda: (randn(3, 4),), capsys, backend, graphs=2, breaks=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_and_partial_across_break(backend, capsys):
    check_break(_set_and_partial_live, lambda: (randn(3, 4),), capsys, backend, graphs=2, breaks=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_of_intermediate_across_break(backend, capsys):
    check_break(_intermediate_view_live, lambda: (randn(4, 4),), capsys, backend, graphs=2, breaks=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_of_input_across_break(backend, capsys):
    """The glue takes the same view of the real input, so the write after the break shows (the
    prefix computes nothing: no graph before the break)."""
    check_break(_input_view_live, lambda: (randn(4, 3),), capsys, backend, graphs=1, breaks=1)


def _two_views_live(x):
    y = x * 1.0
    a, b = y[0], y[:2]  # overlapping views of one intermediate
    kiln.graph_break()
    a.add_(1)  # must show in b: this rest cannot get them as two copies
    return b * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_overlapping_views_of_intermediate_across_break(backend, capsys):
    """Both views are taken again from their base (a prefix output): the write shows in both."""
    check_break(_two_views_live, lambda: (randn(3, 4),), capsys, backend, graphs=2, breaks=1)


def _view_and_uncertain_reshape_live(x):
    y = x.t() * 1.0  # layout-following op: y's eager strides are known
    a = y.reshape(-1)  # eager may copy or alias here: kiln cannot take it again as a view
    b = y[0]
    kiln.graph_break()
    b.add_(1)
    return a * 2, y


def test_uncertain_view_stays_correct():
    x = randn(3, 4)
    got = kiln.compile(_view_and_uncertain_reshape_live, backend="eager")(x)
    want = _view_and_uncertain_reshape_live(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
