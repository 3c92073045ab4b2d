"""Builtins and math on constants, f-strings and string ops, isinstance/len/getattr/hasattr,
min/max/sum/abs/round/divmod, global constants."""
import math
import operator

import torch

from corpus import case, rand, x48, xy48

EPS = 1e-5
NAMES = ("q", "k", "v")
TABLE = {"small": 2, "big": 8}


@case(x48)
def math_functions(x):
    a = math.sqrt(16) + math.log(math.e) + math.exp(0) + math.floor(2.7) + math.ceil(2.1)
    b = math.pi / 2 + math.cos(0.0) + math.sin(0.0) + math.tanh(0.0) + math.pow(2, 3)
    return x * a + b + (0 if math.isfinite(a) else math.inf)


@case(x48)
def math_on_shapes(x):
    d = x.shape[-1]
    return x / math.sqrt(d) + math.log2(d) + math.prod(x.shape) + math.gcd(12, d)


@case(x48)
def min_max_sum_abs(x):
    a = max(1, 5, 3) + min(4, 2) + sum([1, 2, 3]) + abs(-4) + abs(-2.5)
    return x * a + max(x.shape) - min(x.shape)


@case(xy48)
def abs_of_tensor(x, y):
    return abs(x) + abs(x - y)


@case(x48)
def round_divmod_pow(x):
    q, r = divmod(17, 5)
    return x * round(2.567, 1) + pow(2, 3) + q - r + round(3.5)


@case(x48)
def int_float_bool(x):
    n = int("3") + int(2.9) + float("0.5") + bool(1) + int(True)
    return x * n


@case(x48)
def fstrings(x):
    name = f"layer_{x.shape[0]}_{x.dim():02d}_{EPS!r}_{1.5:.2f}"
    return x * len(name)


@case(x48)
def string_methods(x):
    s = "Hello_World"
    parts = s.lower().split("_")
    ok = s.startswith("Hel") and s.endswith("rld") and "World" in s
    t = "-".join(parts).upper().replace("-", "+")
    return x * (len(t) + ok + s.count("l") + s.find("W"))


@case(x48)
def string_format(x):
    key = "{}.{}".format("blocks", 3)
    return x * len(key) + len("%s-%d" % ("a", 5))


@case(x48)
def isinstance_checks(x):
    n = 0
    n += isinstance(3, int) + isinstance(3.0, (int, float)) + isinstance("s", str)
    n += isinstance(x, torch.Tensor) + isinstance([x], list) + isinstance((1,), tuple)
    n += isinstance(None, type(None)) + isinstance(x.shape, tuple)
    return x * n


@case(x48)
def len_checks(x):
    return x * (len([1, 2]) + len((x, x, x)) + len({"a": 1}) + len("abc") + len(x) + len(range(5)))


@case(x48)
def getattr_hasattr(x):
    n = getattr(torch, "float32") is torch.float32
    h = hasattr(x, "shape") + hasattr(x, "no_such_attribute")
    f = getattr(torch, "relu")
    return f(x) * (n + h) + getattr(x, "T", None).sum()


@case(x48)
def global_constants(x):
    out = x * EPS
    for n in NAMES:
        out = out + len(n)
    return out * TABLE["big"]


@case(x48)
def operator_module(x):
    return operator.add(x, 1) * operator.mul(2, 3) - operator.neg(x)


@case(x48)
def sorted_enumerate_constants(x):
    order = sorted([3, 1, 2], reverse=True)
    return x * order[0] + list(enumerate("ab"))[1][0]


@case(x48)
def tuple_list_conversions(x):
    t = tuple([1, 2, 3])
    lst = list(t) + [4]
    lst.insert(0, 0)
    last = lst.pop()
    return x * (sum(lst) + last + t.index(2) + lst.count(0))


@case(x48)
def constant_arithmetic(x):
    a = 2 ** 10 // 3 % 7 - (5 << 1) + (6 >> 1) + (3 & 1) + (4 | 1) + (5 ^ 2)
    b = 7 / 2 - -3 + +2 + ~1
    return x * a + b


@case(x48)
def dtype_and_device_constants(x):
    dt = torch.float32
    dev = torch.device("cpu")
    y = x.to(dtype=dt, device=dev)
    if dt.is_floating_point and dev.type == "cpu":
        y = y * 2
    return y + torch.finfo(torch.float32).eps


@case(x48)
def slice_and_range_objects(x):
    s = slice(1, None, 2)
    r = range(2, 8, 3)
    return x[:, s] * len(r) + r[1]


@case(x48)
def none_checks(x):
    a = None
    b = a if a is not None else 3
    return x * b if a is None else x


@case(x48)
def bool_of_containers(x):
    if [] or () or {} or "":
        return x
    if [1] and (1,) and {"a": 1} and "s":
        return x * 2
    return x
