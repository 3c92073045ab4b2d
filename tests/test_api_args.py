"""kiln.compile's arguments: bad values raise, naming the argument and what it accepts (issue 24,
item 8); torch.compile's keywords are all accepted."""
import inspect

import pytest
import torch

import kiln


def f(x):
    return x.sin() + 1


@pytest.mark.parametrize("kw, exc, words", [
    (dict(dynamic="sometimes"), TypeError, ["dynamic", "None", "True", "False"]),
    (dict(fullgraph="yes"), TypeError, ["fullgraph", "True or False"]),
    (dict(fullgraph=1), TypeError, ["fullgraph"]),
    (dict(disable="no"), TypeError, ["disable"]),
    (dict(options={"no_such_key": 1}), ValueError, ["no_such_key", "ddp_split", "max_autotune"]),
    (dict(options={"max_autotune": "on"}), TypeError, ["max_autotune", "True or False"]),
    (dict(options=[("max_autotune", True)]), TypeError, ["options", "dict"]),
    (dict(mode="fastest"), ValueError, ["mode", "reduce-overhead", "max-autotune"]),
    (dict(backend="inductor"), ValueError, ["backend", "kiln", "aot_eager"]),
])
def test_bad_argument_names_itself_and_what_it_accepts(kw, exc, words):
    with pytest.raises(exc) as info:
        kiln.compile(f, **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    with pytest.raises(exc):  # the decorator form checks at once too
        kiln.compile(**kw)


def test_signature_has_torch_compile_keywords():
    """The keywords DESIGN.md section 3 lists (torch 2.13's newer name, recompile_limit,
    isolate_recompiles and shapes_spec are not in kiln yet)."""
    ours = inspect.signature(kiln.compile).parameters
    theirs = inspect.signature(torch.compile).parameters
    wanted = ["model", "fullgraph", "dynamic", "backend", "mode", "options", "disable"]
    assert set(wanted) <= set(theirs) and set(wanted) <= set(ours), set(wanted) - set(ours)
    assert list(ours)[0] == "model"


def test_model_keyword_and_disable():
    x = torch.randn(5)
    cf = kiln.compile(model=f)
    torch.testing.assert_close(cf(x), f(x))
    assert kiln.stats()["frames_compiled"] == 1
    assert kiln.compile(f, disable=True) is f
    assert kiln.compile(disable=True)(f) is f


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs", "default", None])
def test_modes_are_accepted_and_compile(mode):
    x = torch.randn(8)
    cf = kiln.compile(f, mode=mode, options={"max_autotune": mode is None})
    torch.testing.assert_close(cf(x), f(x))
    assert kiln.stats()["frames_compiled"] == 1


def test_max_autotune_turns_autotuning_on_for_its_compile(monkeypatch):
    from kiln import api
    seen = []
    real = api.compile_graph

    def spy(graph, backend):
        seen.append(kiln.config.triton_autotune)
        return real(graph, backend)
    monkeypatch.setattr(api, "compile_graph", spy)
    x = torch.randn(8)
    kiln.compile(f, mode="max-autotune-no-cudagraphs")(x)
    kiln.compile(lambda x: x.cos(), mode=None)(x)
    assert seen == [True, bool(kiln.config.triton_autotune)]
