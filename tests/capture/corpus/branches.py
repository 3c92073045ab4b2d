"""if/else on Python values: constants, arguments, shapes, dtypes, module flags; guards make a
changed value recompile."""
import torch
from torch import nn

from corpus import Call, case, rand, x48, xy48

MODE = "relu"
USE_BIAS = True


@case(lambda: Call((rand(4, 8),), {"flag": True}))
def if_on_bool_arg(x, flag=False):
    if flag:
        return x.relu()
    return x.sigmoid()


@case(calls=[lambda: (rand(4, 8), 2), lambda: (rand(4, 8), 2), lambda: (rand(4, 8), 3)],
      compiles=2)
def if_on_int_arg_recompiles(x, n):
    if n > 2:
        return x * n
    return x - n


@case(calls=[lambda: (rand(4, 8), "relu"), lambda: (rand(4, 8), "tanh")], compiles=2)
def if_on_str_arg(x, act):
    if act == "relu":
        return torch.relu(x)
    elif act == "tanh":
        return torch.tanh(x)
    return x


@case(calls=[lambda: (rand(4, 8), None), lambda: (rand(4, 8), rand(4, 8))], compiles=2)
def if_none(x, mask):
    if mask is None:
        return x * 2
    return x * mask


@case(calls=[lambda: (rand(4, 8),), lambda: (rand(3, 8),)], compiles=2)
def if_on_shape(x):
    if x.shape[0] == 4:
        return x + 1
    return x - 1


@case(calls=[lambda: (rand(4, 8),), lambda: (rand(4, 8, dtype=torch.float16),)], compiles=2,
      dtype=torch.float16)
def if_on_dtype(x):
    if x.dtype == torch.float16:
        return x.float() * 2
    return x * 3


@case(x48)
def if_on_global(x):
    if MODE == "relu":
        x = x.relu()
    if USE_BIAS:
        x = x + 1
    return x


@case(x48)
def ternary(x):
    k = 3
    y = x * 2 if k > 2 else x / 2
    return y if x.dim() == 2 else y.sum()


@case(x48)
def and_or_chains(x):
    a, b = 3, None
    use = a > 2 and b is None
    other = b or a
    if use and not (a == 4 or other != 3):
        return x * other
    return x


@case(x48)
def elif_chain(x):
    n = x.shape[1]
    if n < 4:
        return x
    elif n < 8:
        return x * 2
    elif n == 8:
        return x * 3
    else:
        return x * 4


@case(x48)
def chained_comparison(x):
    lo, hi = 2, 10
    if lo < x.shape[1] <= hi:
        return x.abs()
    return x


@case(x48)
def not_in_branch(x):
    names = ("a", "b")
    if "c" not in names and "a" in names:
        return x + 1
    return x


@case(x48)
def isinstance_branch(x):
    cfg = (1, 2)
    if isinstance(cfg, tuple):
        x = x * len(cfg)
    if isinstance(x, torch.Tensor):
        x = x + 1
    return x


class TrainingFlagNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            return y * 2
        return y


def _set_eval(m):
    m.eval()
    return m


@case(calls=[lambda: (rand(4, 8),), lambda: (rand(4, 8),)], build=lambda: _seeded(TrainingFlagNet),
      compiles=1)
def training_flag_train():
    pass


def _seeded(cls):
    torch.manual_seed(0)
    return cls()


@case(x48, build=lambda: _set_eval(_seeded(TrainingFlagNet)))
def training_flag_eval():
    pass


@case(xy48)
def if_on_requires_grad(x, y):
    if x.requires_grad:
        return x * y
    return x + y


@case(x48)
def if_on_grad_enabled(x):
    if torch.is_grad_enabled():
        return x * 2
    return x


@case(calls=[lambda: (rand(4, 8), [1, 2]), lambda: (rand(4, 8), [1, 2]), lambda: (rand(4, 8), [1, 2, 3])],
      compiles=2)
def if_on_list_length(x, sizes):
    if len(sizes) == 2:
        return x * sizes[0] + sizes[1]
    return x * sum(sizes)


@case(calls=[lambda: (rand(4, 8), 0.5), lambda: (rand(4, 8), 0.25)], compiles=2)
def float_arg_specialized(x, p):
    if p > 0.3:
        return x * p
    return x / p
