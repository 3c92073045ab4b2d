"""List, dict and set comprehensions, and generator expressions (consumed by sum, tuple, list,
any/all, torch.cat, str.join, dict(), max/min on constants)."""
import torch

from corpus import case, rand, x48, xy48


@case(x48)
def list_comp(x):
    return [x * i for i in range(3)]


@case(x48)
def list_comp_with_if(x):
    return torch.stack([x + i for i in range(6) if i % 2 == 0])


@case(xy48)
def nested_list_comp(x, y):
    grid = [[a * b for b in (x, y)] for a in (x, y)]
    return grid[0][1] + grid[1][0]


@case(x48)
def dict_comp(x):
    d = {f"k{i}": x * i for i in range(3)}
    return d["k2"] - d["k1"]


@case(x48)
def set_comp(x):
    sizes = {s % 3 for s in (1, 2, 3, 4, 5, 6)}
    return x * len(sizes) + max(sizes)


@case(xy48)
def genexpr_sum_tensors(x, y):
    return sum(t * 2 for t in (x, y))


@case(x48)
def genexpr_sum_constants(x):
    n = sum(i * i for i in range(4))
    return x + n


@case(xy48)
def genexpr_tuple(x, y):
    return tuple(t.relu() for t in [x, y])


@case(xy48)
def genexpr_cat(x, y):
    return torch.cat(list(t.sin() for t in (x, y)), dim=0)


@case(x48)
def genexpr_any_all(x):
    dims = (4, 8, 16)
    if any(d > 10 for d in dims) and all(d % 4 == 0 for d in dims):
        return x * 2
    return x


@case(x48)
def genexpr_join(x):
    name = "_".join(str(i) for i in range(3))
    return x * len(name)


@case(x48)
def genexpr_max_min(x):
    hi = max(d * 2 for d in x.shape)
    lo = min(d for d in x.shape)
    return x * hi - lo


@case(x48)
def genexpr_dict(x):
    d = dict((f"p{i}", x + i) for i in range(2))
    return d["p1"]


@case(x48)
def genexpr_over_shape(x):
    numel = 1
    for d in (s for s in x.shape):
        numel *= d
    return x.reshape(numel)


@case(xy48)
def genexpr_closure(x, y):
    scale = 3
    return torch.stack(tuple(t * scale for t in (x, y)))


@case(x48)
def comprehension_shadowing(x):
    i = 10
    vals = [i * 2 for i in range(3)]
    return x * i + vals[-1]


@case(x48)
def comp_over_enumerate_zip(x):
    pairs = [(i, a + b) for i, (a, b) in enumerate(zip((1, 2), (3, 4)))]
    return sum(x * i + v for i, v in pairs)


@case(xy48)
def nested_genexpr(x, y):
    return sum(sum(t * k for k in range(2)) for t in (x, y))


def _gen(x, n):
    for i in range(n):
        yield x * i


@case(x48)
def generator_function(x):
    return list(_gen(x, 3))[2]


@case(x48)
def generator_function_sum(x):
    return sum(_gen(x, 4))
