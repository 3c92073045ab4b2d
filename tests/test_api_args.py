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


def test_signature_has_every_torch_compile_keyword():
    ours = inspect.signature(kiln.compile).parameters
    theirs = inspect.signature(torch.compile).parameters
    assert set(theirs) <= set(ours), set(theirs) - set(ours)
    assert list(ours)[0] == "model"
    for k in theirs:
        if k != "backend":  # torch's backend default is None (inductor); kiln's is "kiln"
            assert ours[k].default == theirs[k].default, k


@pytest.mark.parametrize("kw, exc, words", [
    (dict(recompile_limit=0), ValueError, ["recompile_limit", "int >= 1"]),
    (dict(recompile_limit="8"), ValueError, ["recompile_limit"]),
    (dict(isolate_recompiles=1), TypeError, ["isolate_recompiles"]),
    (dict(name=3), TypeError, ["name", "str"]),
    (dict(shapes_spec={"x": 0}), ValueError, ["shapes_spec", "None"]),
])
def test_newer_torch_compile_keywords_are_checked(kw, exc, words):
    with pytest.raises(exc) as info:
        kiln.compile(f, **kw)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_recompile_limit_per_compile():
    import warnings

    def g(x):
        return x * 2
    cg = kiln.compile(g, dynamic=False, recompile_limit=2)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for n in range(1, 5):
            x = torch.randn(n)
            torch.testing.assert_close(cg(x), g(x))
    assert kiln.stats()["frames_compiled"] == 2 and kiln.stats()["eager_runs"] == 2
    assert any("recompile limit (2)" in str(w.message) for w in record)
    strict = kiln.compile(lambda x: x + 1, dynamic=False, fullgraph=True, recompile_limit=1)
    strict(torch.randn(1))
    with pytest.raises(kiln.GraphBreakError, match="recompile limit"):
        strict(torch.randn(2))


def test_isolate_recompiles_and_name():
    def g(x):
        return x - 1
    x = torch.randn(3)
    a = kiln.compile(g, name="my_region")
    b = kiln.compile(g, isolate_recompiles=True)
    torch.testing.assert_close(a(x), g(x))
    torch.testing.assert_close(b(x), g(x))
    assert a.name == "my_region"
    assert kiln.stats()["frames_compiled"] == 2  # b did not reuse a's entry
    kiln.compile(g)(x)
    assert kiln.stats()["frames_compiled"] == 2  # a third, shared compile reuses a's


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
