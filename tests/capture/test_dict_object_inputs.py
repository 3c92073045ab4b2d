"""A real transformers ModelOutput (a dataclass over OrderedDict) handed to compiled code as an
input, as a resumed frame gets it after a graph break: dict's own read methods (keys, values,
items, get, len, iteration, ``in``, and ``to_tuple``, which reads ``self.keys()``) are traced
from the real object with its keys guarded, with no graph break
(``kiln/capture/dict_object.py``)."""
import pytest
import torch

import kiln
from testing import assert_close

transformers = pytest.importorskip("transformers")
Out = transformers.modeling_outputs.CausalLMOutput


def _reads(out):
    total = sum(v.sum() for v in out.values())
    for k in out:
        total = total + out[k].mean()
    for k, v in out.items():
        total = total + (v.amax() if k == "logits" else v)
    first = out.to_tuple()[0]
    extra = out.get("loss", torch.zeros(())) * len(out) + (1.0 if "loss" in out else 2.0)
    return total + first.sum() + extra + len(out.keys())


def _compile(fn):
    return kiln.compile(fn, fullgraph=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_output_input_reads_match_eager_without_a_break(dtype):
    kiln.reset()
    f = _compile(_reads)
    for with_loss in (True, False, True):
        logits = torch.randn(2, 5, 7, dtype=dtype).transpose(0, 1)  # non-contiguous
        out = Out(logits=logits, loss=torch.randn((), dtype=dtype)) if with_loss else Out(logits=logits)
        got, want = f(out), _reads(out)
        assert got.dtype == want.dtype
        assert_close(got, want, dtype=dtype)  # bf16 sums: kiln rounds once, eager per op
    assert kiln.stats()["graph_breaks"] == 0


def test_keys_are_guarded():
    """A ModelOutput with other keys is another entry, never the first one's answer."""
    kiln.reset()
    f = _compile(lambda o: torch.stack([v.sum() for v in o.values()]))
    a = Out(logits=torch.randn(3), loss=torch.randn(()))
    b = Out(logits=torch.randn(3))
    assert f(a).shape == (2,) and f(b).shape == (1,)
    assert_close(f(b), b.logits.sum()[None])
    assert kiln.stats()["frames_compiled"] + kiln.stats()["recompiles"] >= 2


def test_items_of_an_object_written_in_the_trace_break_cleanly():
    """A trace that wrote an attribute first would read stale items: a graph break, eager's answer."""
    def g(o, x):
        o.logits = x * 2
        return torch.stack([v.sum() for v in o.values()])
    kiln.reset()
    x = torch.randn(4)
    want = g(Out(logits=torch.randn(4)), x)
    got = kiln.compile(g)(Out(logits=torch.randn(4)), x)
    assert_close(got, want)


def test_model_output_across_a_graph_break_resumes_compiled():
    """The resumed frame gets the real ModelOutput made before the break (the eager part) and
    reads it with dict methods; nothing after the break runs eagerly."""
    def h(x):
        out = Out(logits=x.relu())
        print("break here")  # a graph break
        return sum(v.sum() for v in out.values()) + len(out.to_tuple())
    kiln.reset()
    x = torch.randn(3, 4)
    assert_close(kiln.compile(h)(x), h(x))
    assert kiln.stats().get("eager_runs", 0) == 0
