"""examples/resnet.py and examples/hf_gpt2.py at tiny size on the CPU: transformers' ResNet and
GPT-2 match eager in inference and after one training step (loss, gradients, parameters and
batch-norm buffers), and report graph/break counts and kiln/eager speed ratios."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples"))
import compare  # noqa: E402
from testing import CUDA  # noqa: E402

pytest.importorskip("transformers")

DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # a small shared CI machine: no thread pool spinning on busy cores
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # fp32 convolutions on CUDA held to fp32 tolerances
    yield
    torch.set_num_threads(n)
    torch.backends.cudnn.allow_tf32 = tf32


def _check(results):
    assert set(results) == {"inference", "train step"}
    for name, r in results.items():
        print(f"{name}: {r['graphs']} graphs of {r['ops']} ops, {r['graph_breaks']} breaks, largest "
              f"difference {r['max_abs_diff']:.2e}, kiln/eager {r['speedup']:.2f}x")
        assert r["match"], (name, r.get("mismatches"))
        assert r["graphs"] >= 1 and len(r["break_reasons"]) == r["graph_breaks"]
        assert r["eager_ms"] > 0 and r["kiln_ms"] > 0 and r["speedup"] > 0
    return results["train step"]


@pytest.mark.parametrize("device", DEVICES)
def test_resnet_example(device):
    import resnet
    results = resnet.run(arch="transformers", size="tiny", device=device, quiet=True)
    train = _check(results)
    assert results["inference"]["graph_breaks"] == 0 and train["graph_breaks"] == 0
    assert results["inference"]["ops"] > 20 and train["ops"] > 20  # the model is in the graph
    # loss, every gradient and parameter, and the batch norms' running stats were compared
    n_params = sum(1 for _ in resnet.build("transformers", "tiny")[0].parameters())
    assert train["checked"] >= 1 + 2 * n_params + 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hf_gpt2_example(attn, device):
    import hf_gpt2
    results = hf_gpt2.run(size="tiny", attn=attn, device=device, quiet=True)
    train = _check(results)
    n_params = sum(1 for _ in hf_gpt2.build("tiny")[0].parameters())
    assert train["checked"] >= 1 + 2 * n_params
    for name, r in results.items():
        # Known capture limitation (transformers 5): a break in the output-capturing wrapper
        # around GPT2Model.forward leaves the transformer blocks running eagerly, so the
        # comparison above then mostly proves that eager matches eager. Reported, not hidden.
        if r["ops"] < 20:
            pytest.xfail(f"{name}: kiln compiled only {r['ops']} ops of transformers' GPT-2 (the blocks "
                         f"ran eagerly); breaks: {r['break_reasons'][:3]}")


class _Scaled(torch.nn.Module):
    """A stand-in for a wrong compiler: the wrapped model's output times a factor."""

    def __init__(self, inner, factor):
        super().__init__()
        self.inner, self.factor = inner, factor

    def forward(self, *args):
        return self.inner(*args) * self.factor


def test_compare_catches_a_wrong_step(monkeypatch):
    """The training-step comparison fails when the compiled model computes something else,
    even by 1%: eager's own change under a one-ulp nudge of its weights is far smaller."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    ok = compare.compare_training_step(model, (x,), lambda out: out.square().mean(),
                                       lambda ps: torch.optim.SGD(ps, lr=0.1), repeat=1)
    assert ok["match"] and not ok["within_rounding_noise"], ok["mismatches"]
    for factor in (1.5, 1.01):
        monkeypatch.setattr(compare.kiln, "compile", lambda m, f=factor: _Scaled(m, f))
        bad = compare.compare_training_step(model, (x,), lambda out: out.square().mean(),
                                            lambda ps: torch.optim.SGD(ps, lr=0.1), repeat=1)
        assert not bad["match"] and "loss" in bad["mismatches"]
        assert any(m.startswith("grad ") for m in bad["mismatches"])


class _Knife(torch.nn.Module):
    """relu(x * w - x * w0) with w0 == w: every pre-activation is zero up to rounding, so
    which gradient elements pass depends on rounding alone (an ill-conditioned gradient, as
    in a batch-normed ResNet, made extreme). ``swap`` groups the sums another way: the same
    function in exact arithmetic, other rounding."""

    def __init__(self, n, swap=False):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n))
        self.register_buffer("w0", self.w.detach().clone())
        self.swap = swap

    def forward(self, x):
        s = (x * (self.w * 3.0) / 3.0) if self.swap else (x * self.w)
        return torch.relu(s - x * self.w0) * 3.0 + self.w * 0.5


def test_compare_accepts_differences_at_the_rounding_noise_floor(monkeypatch):
    """Where eager's own gradients move under a one-ulp nudge of its weights, a compiled model
    that only rounds differently matches within that noise, and the report says so."""
    torch.manual_seed(0)
    model = _Knife(64)
    x = torch.randn(8, 64)

    def other_rounding(m):
        twin = _Knife(64, swap=True)
        twin.w, twin.w0 = m.w, m.w0  # the same parameter: the optimizer steps it
        return twin
    monkeypatch.setattr(compare.kiln, "compile", other_rounding)
    r = compare.compare_training_step(model, (x,), lambda out: out.sum(),
                                      lambda ps: torch.optim.SGD(ps, lr=0.1), repeat=1)
    assert r["match"], r["mismatches"]
    assert "grad w" in r["within_rounding_noise"]
