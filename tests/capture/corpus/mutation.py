"""Python state mutated inside the traced code is replayed after the graph runs, as in eager:
appends to outer lists, dict item sets, attributes set on modules and plain objects, globals,
closure cells. Tensors stored into Python state are the graph's real outputs."""
import torch
from torch import nn

from corpus import case, rand, x48, xy48

LOG = []
COUNTS = {}


def _seeded(cls, *args):
    def build():
        torch.manual_seed(0)
        return cls(*args)
    return build


# ---------------------------------------------------------------- module attributes
class CallCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


# calls == 0 specialized, then (it changed) a symbol from 1 on: 2 compiles for any number of calls
@case(calls=[x48, x48, x48], build=_seeded(CallCounter), state=lambda m: m.calls, compiles=2)
def module_counter():
    pass


class Cache(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = None

    def forward(self, x):
        y = x.exp()
        self.cache = y * 2
        self.last_shape = tuple(x.shape)
        return y + self.cache


@case(calls=[x48, x48], build=_seeded(Cache), state=lambda m: (m.cache, m.last_shape), compiles=1)
def module_tensor_attribute():
    pass


class ReadsItsWrite(nn.Module):
    def forward(self, x):
        self.tmp = x * 3
        self.flag = True
        return self.tmp + (1 if self.flag else 0)


@case(x48, build=_seeded(ReadsItsWrite), state=lambda m: (m.tmp, m.flag))
def module_attr_read_after_write():
    pass


class Stats(nn.Module):
    def __init__(self):
        super().__init__()
        self.history = []
        self.stats = {}

    def forward(self, x):
        m = x.mean()
        self.history.append(m)
        self.stats["max"] = x.amax()
        return x - m


@case(calls=[x48, x48], build=_seeded(Stats), state=lambda m: (m.history, m.stats), compiles=2)
def module_list_and_dict_attributes():
    pass


# ---------------------------------------------------------------- arguments
@case(lambda: (rand(4, 8), []), state=None)
def append_to_argument_list(x, out):
    out.append(x * 2)
    out.append("done")
    return x + 1, out


@case(lambda: (rand(4, 8), {"seen": 1}))
def dict_argument_set(x, d):
    d["y"] = x * 2
    d["seen"] = d["seen"] + 1
    del d["seen"]
    return d


class Box:
    def __init__(self):
        self.value = None
        self.n = 0


@case(lambda: (rand(4, 8), Box()))
def object_attribute_set(x, box):
    box.value = x.cos()
    box.n = box.n + 1
    return box.value * box.n, box.n


# ---------------------------------------------------------------- globals and closures
def _log_build():
    LOG.clear()

    def fn(x):
        LOG.append(x.shape[0])
        LOG.append(x * 2)
        return x + 1
    return fn


@case(calls=[x48, x48], build=_log_build, state=lambda fn: list(LOG), compiles=2)
def global_list_append():
    pass


def _counts_build():
    COUNTS.clear()

    def fn(x):
        COUNTS["calls"] = COUNTS.get("calls", 0) + 1
        return x * COUNTS["calls"]
    return fn


@case(calls=[x48, x48, x48], build=_counts_build, state=lambda fn: dict(COUNTS), compiles=3)
def global_dict_set():
    pass


TOTAL = 0.0


def _global_store_build():
    global TOTAL
    TOTAL = 0.0

    def fn(x):
        global TOTAL
        TOTAL = TOTAL + 0.5
        return x + TOTAL
    return fn


@case(calls=[x48, x48], build=_global_store_build, state=lambda fn: TOTAL, compiles=2)
def global_store():
    pass


def _closure_build():
    history = []
    steps = 0

    def fn(x):
        nonlocal steps
        steps += 1
        history.append(x.sum())
        return x * steps

    fn.state = lambda: (steps, list(history))
    return fn


@case(calls=[x48, x48], build=_closure_build, state=lambda fn: fn.state(), compiles=2)
def closure_cell_mutation():
    pass


def _local_only(x):
    acc = []
    d = {}
    for i in range(3):
        acc.append(x * i)
        d[i] = acc[-1]
    acc.pop(0)
    d.pop(2)
    return sum(acc) + d[1]


case(x48)(_local_only)


@case(xy48)
def local_object_state(x, y):
    box = Box()
    box.value = x
    box.value = box.value + y
    return box.value
