"""A callee that breaks, called from several places of one explained (or
``isolate_recompiles``) compile: each call site compiles it through a ``CompiledFunction`` of
its own (kiln/breaks.py), and their private caches are one family, shared by code, as the
shared caches are. Before, every call site compiled the callee again: an explained I-BERT's
activation quantizer, called 46 times a step, compiled at every call site."""
import collections

import torch

import kiln


def clipped(x):
    y = x * 2
    if y.sum() > 0:  # data-dependent: a break inside the callee
        y = y - 1
    return y.tanh()


def three_sites(x):
    a = clipped(x)
    b = clipped(x + 1)
    c = clipped(x - 1)
    return a + b + c


def _compiles_by_name(out):
    return collections.Counter(c.name for c in out.compiles)


def test_explain_compiles_a_breaking_callee_once_for_all_call_sites():
    x = torch.rand(8) + 0.5
    kiln.reset()
    out = kiln.explain(three_sites, backend="eager")(x)
    torch.testing.assert_close(out.result, three_sites(x))
    names = _compiles_by_name(out)
    assert names["clipped"] == 1, names


def test_isolated_compile_shares_callee_entries_within_itself_only():
    x = torch.rand(8) + 0.5
    kiln.reset()
    first = kiln.compile(three_sites, backend="eager", isolate_recompiles=True)
    torch.testing.assert_close(first(x), three_sites(x))
    family = first._private_family
    callee = [cache for key, cache in family.items() if key[0] is clipped.__code__]
    assert len(callee) == 1 and len(callee[0].entries) == 1
    second = kiln.compile(three_sites, backend="eager", isolate_recompiles=True)
    torch.testing.assert_close(second(x), three_sites(x))
    assert second._private_family is not family  # isolated from the first compile
