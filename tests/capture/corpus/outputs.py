"""What a function returns: dataclasses, namedtuples, dicts, nested lists/tuples, constants,
None, inputs returned unchanged, the same tensor twice."""
import collections
import dataclasses
import typing

import torch
from torch import nn

from corpus import case, rand, x48, xy48


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    hidden: torch.Tensor
    aux: float = 0.0


Pair = collections.namedtuple("Pair", ["first", "second"])


class TypedPair(typing.NamedTuple):
    a: torch.Tensor
    b: torch.Tensor
    n: int = 3


@case(x48)
def dataclass_output(x):
    return Output(logits=x.relu(), hidden=x * 2, aux=1.5)


@case(x48)
def dataclass_positional(x):
    return Output(x + 1, x - 1)


@case(xy48)
def namedtuple_output(x, y):
    return Pair(x + y, second=x - y)


@case(xy48)
def typed_namedtuple_output(x, y):
    p = TypedPair(x, y)
    return TypedPair(p.a * p.n, p.b + p[0])


@case(xy48)
def namedtuple_unpacked(x, y):
    p = Pair(x, y)
    a, b = p
    return a * b + p.first + p[1]


@case(x48)
def dict_output(x):
    return {"mean": x.mean(0), "max": x.amax(1), "name": "stats"}


@case(xy48)
def nested_output(x, y):
    return [x, (y, [x + y, {"z": y * 2}]), None, 3]


@case(x48)
def constant_output_parts(x):
    return x * 2, x.shape, x.dtype, None, "tag"


@case(xy48)
def input_returned(x, y):
    return x, y + 1


@case(x48)
def same_tensor_twice(x):
    y = x + 1
    return y, y, [y]


@case(x48)
def dataclass_fields_read(x):
    o = Output(x, x * 3)
    return o.logits + o.hidden + o.aux


@case(x48)
def dataclass_replace_like(x):
    o = Output(x, x)
    o2 = dataclasses.replace(o, hidden=x * 5)
    return o2


@case(x48)
class ModuleReturnsNamedTuple(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        h = self.lin(x)
        return Pair(first=h, second=h.softmax(-1))


@case(x48)
class ModuleReturnsDataclass(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return Output(logits=self.lin(x), hidden=x)


@case(x48)
def dict_built_incrementally(x):
    out = {}
    out["a"] = x
    out.update({"b": x * 2})
    out.setdefault("c", x * 3)
    return out


@case(x48)
def list_output_built_with_ops(x):
    out = [x]
    out += [x * 2]
    out.extend([x * 3])
    return out + [x * 4]


@case(x48)
def only_constants(x):
    return x.shape[0] * 2


@case(x48)
def returns_none_and_tensor(x):
    return None if x.dim() == 3 else x.neg()
