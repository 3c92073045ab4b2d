"""A list from the inputs indexed by a dynamic int (capture/dynamic_index.py): the shape of a
KV cache's ``cache.layers[self.layer_idx]``, reached from one code object through many layers.
Every result and every written state is compared with eager on each call."""
import pytest
import torch

import kiln


class Slot:
    def __init__(self, t):
        self.t = t


class Store:
    def __init__(self, n):
        self.items = [Slot(torch.randn(2, 3)) for _ in range(n)]


class Layer(torch.nn.Module):
    def __init__(self, idx):
        super().__init__()
        self.idx = idx
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, store):
        slot = store.items[self.idx]
        slot.t = slot.t + self.lin(x)  # written through the symbolic index: replayed per call
        return slot.t * 2


def _pair(n, seed=0):
    torch.manual_seed(seed)
    layers = [Layer(i) for i in range(n)]
    torch.manual_seed(seed)
    ref = [Layer(i) for i in range(n)]
    return layers, ref


def _stores(n):
    torch.manual_seed(1)
    a = Store(n)
    b = Store(n)
    for sa, sb in zip(a.items, b.items):
        sb.t = sa.t.clone()
    return a, b


@pytest.mark.parametrize("wrap", ["each", "code"])
def test_layers_share_one_entry_and_write_their_own_slot(wrap):
    """Ten layers, each wrapped (or one compiled function reached with each): idx 0 is a
    constant, then idx is a symbol (0 and 1 included) and every layer hits that entry; the
    writes land in the slot of the layer that ran. Before: one entry per idx, then the
    recompile limit (8) and eager runs."""
    kiln.reset()
    n = 10
    layers, ref = _pair(n)
    store, want = _stores(n)
    if wrap == "each":
        fns = [kiln.compile(layer, backend="eager") for layer in layers]
    else:
        shared = kiln.compile(lambda layer, x, s: layer(x, s), backend="eager")
        fns = [lambda x, s, layer=layer: shared(layer, x, s) for layer in layers]
    with torch.no_grad():
        for step in range(2):
            x = torch.randn(2, 3)
            for i in range(n):
                torch.testing.assert_close(fns[i](x, store), ref[i](x, want), msg=f"step {step} layer {i}")
                for j in range(n):
                    torch.testing.assert_close(store.items[j].t, want.items[j].t)
    s = kiln.stats()
    assert s["eager_runs"] == 0 and s["fallbacks"] == 0, s
    assert s["frames_compiled"] == 2, s  # idx == 0, then idx symbolic (>= 0, < 10)


class MixedLayer(Layer):
    def forward(self, x, store):
        a = store.items[self.idx].t
        b = store.items[2].t  # the same object as items[idx] when idx == 2, another one else
        return a + b + self.lin(x)


def test_a_constant_index_beside_the_symbolic_one_specializes():
    """items[idx] and items[2] in one frame: the capture cannot tell them apart on later calls,
    so the index is traced as a constant (static_ints) and each idx gets its own entry;
    results stay eager's."""
    kiln.reset()
    torch.manual_seed(0)
    layers = [MixedLayer(i) for i in range(4)]
    store, _ = _stores(4)
    fns = [kiln.compile(layer, backend="eager") for layer in layers]
    x = torch.randn(2, 3)
    with torch.no_grad():
        for i in (0, 1, 2, 3, 2, 0):
            torch.testing.assert_close(fns[i](x, store), layers[i](x, store), msg=f"layer {i}")
    assert kiln.stats()["eager_runs"] == 0


def test_out_of_range_and_negative_indices_miss_the_entry():
    """The entry made for idx >= 0 and < len is not reused for idx = -1 (Python's last item) or a
    longer list's last index."""
    kiln.reset()
    layers, _ = _pair(3)
    f = kiln.compile(lambda layer, x, s: layer(x, s), backend="eager")
    x = torch.randn(2, 3)
    with torch.no_grad():
        for idx, n in ((0, 3), (1, 3), (2, 3), (-1, 3), (4, 5), (1, 3)):
            store, want = _stores(n)
            layer = layers[0]
            layer.idx = idx
            got = f(layer, x, store)
            torch.testing.assert_close(got, layer(x, want), msg=f"idx {idx}")
            torch.testing.assert_close(store.items[idx].t, want.items[idx].t)
    assert kiln.stats()["eager_runs"] == 0


class Counted(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x):
        pad = torch.zeros(self.n, x.shape[1])  # the int as a size: specialized at 0 and 1
        return torch.cat([x * self.n, pad]).sum(0) + self.n


def test_a_dynamic_int_at_0_and_1_used_as_a_size_is_specialized():
    kiln.reset()
    m = Counted(0)
    f = kiln.compile(m, backend="eager")
    x = torch.randn(2, 3)
    for n in (0, 1, 0, 1, 2, 3, 5, 1):
        m.n = n
        torch.testing.assert_close(f(x), m.forward(x), msg=f"n = {n}")
    s = kiln.stats()
    assert s["eager_runs"] == 0 and s["frames_compiled"] <= 4, s  # 0; 1 (size: == 1); >= 2
