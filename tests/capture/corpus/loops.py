"""Loops, unrolled at trace time: range, lists, tuples, dicts, zip, enumerate, reversed,
nn.ModuleList / ModuleDict / Sequential, while loops on Python values, break/continue."""
import torch
from torch import nn

from corpus import case, rand, x48, xy48, x48_t


@case(x48)
def range_loop(x):
    for i in range(3):
        x = x * 2 + i
    return x


@case(x48)
def range_step_loop(x):
    total = 0
    for j in range(1, 10, 4):
        total += j
    for k in range(5, 0, -2):
        x = x - k
    return x + total


@case(xy48)
def list_loop(x, y):
    out = x
    for t in [x, y, x]:
        out = out * t
    return out


@case(xy48)
def tuple_loop(x, y):
    acc = []
    for t in (x, y):
        acc.append(t.relu())
    return acc[0] + acc[1]


@case(x48)
def dict_loop(x):
    scales = {"a": 1.0, "b": 2.0, "c": -0.5}
    for name in scales:
        x = x + scales[name]
    for k, v in scales.items():
        x = x * v if k != "a" else x
    for v in scales.values():
        x = x - v
    return x


@case(xy48)
def zip_loop(x, y):
    out = []
    for a, b in zip([x, y], [y, x]):
        out.append(a - b * 2)
    return out


@case(xy48)
def enumerate_loop(x, y):
    s = x
    for i, t in enumerate([x, y], start=1):
        s = s + t * i
    return s


@case(xy48)
def reversed_loop(x, y):
    s = []
    for t in reversed([x, y, x + y]):
        s.append(t.sum(0))
    return torch.stack(s)


@case(x48)
def nested_loops(x):
    for i in range(2):
        for j in range(3):
            x = x + i * j
    return x


@case(x48)
def while_loop(x):
    n = 0
    while n < 4:
        x = x * 1.5
        n += 1
    return x


@case(x48)
def break_continue(x):
    for i in range(10):
        if i % 2 == 0:
            continue
        if i > 6:
            break
        x = x + i
    return x


@case(x48)
def for_else(x):
    for i in range(3):
        x = x + i
    else:
        x = x * 2
    return x


@case(lambda: ([rand(4, 8), rand(4, 8), rand(4, 8)],))
def loop_over_input_list(xs):
    total = xs[0]
    for t in xs[1:]:
        total = total + t
    return total


@case(lambda: ({"w": rand(4, 8), "b": rand(8)},))
def loop_over_input_dict(d):
    out = None
    for k, v in d.items():
        out = v if out is None else out + v
    return out


@case(lambda: ((rand(4, 8), rand(4, 8)),))
def loop_over_input_tuple(ts):
    return [t.exp() for t in ts]


class ModuleListNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


case(x48)(ModuleListNet)


@case(x48)
class ModuleListIndexed(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

    def forward(self, x):
        for i in range(len(self.layers)):
            x = self.layers[i](x) + self.layers[-1 - i].bias
        return x


@case(x48)
class ModuleListEnumerate(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])

    def forward(self, x):
        for i, b in enumerate(self.blocks):
            x = b(x) * (i + 1)
        return x


@case(x48)
class ModuleDictNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 4), "b": nn.Linear(8, 4)})

    def forward(self, x):
        outs = {}
        for name, head in self.heads.items():
            outs[name] = head(x)
        return outs["a"] - outs["b"] + self.heads["a"](x)


@case(x48)
class ModuleDictKeys(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"p": nn.Linear(8, 2), "q": nn.Linear(8, 2)})

    def forward(self, x):
        return [self.heads[k](x) for k in self.heads]


@case(x48_t)
class SequentialNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Tanh())

    def forward(self, x):
        return self.seq(x)


@case(x48)
class SequentialIterated(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))

    def forward(self, x):
        for i, m in enumerate(self.seq):
            x = m(x)
        return x + self.seq[0].weight.sum()


@case(x48)
class NestedModuleLists(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList([nn.ModuleList([nn.Linear(8, 8) for _ in range(2)]) for _ in range(2)])

    def forward(self, x):
        for stage in self.stages:
            for layer in stage:
                x = layer(x).sigmoid()
        return x


@case(x48)
def loop_accumulates_list(x):
    feats = []
    for i in range(4):
        feats.append(x[:, i::4])
    return torch.cat(feats, dim=1)


@case(x48)
def loop_tuple_unpack_items(x):
    pairs = [(1, 2.0), (3, 0.5)]
    for a, b in pairs:
        x = x * b + a
    return x
