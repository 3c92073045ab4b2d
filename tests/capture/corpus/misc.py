"""try/except that does not raise, with torch.no_grad / enable_grad, global modules and
functions, torch.nn.functional, context managers that only change grad mode, pass/del."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from corpus import case, rand, x48, xy48

torch.manual_seed(123)
GLOBAL_LINEAR = nn.Linear(8, 4)
ACTS = {"gelu": F.gelu, "silu": F.silu}


@case(x48)
def try_except_no_raise(x):
    try:
        y = x * 2
    except RuntimeError:
        y = x
    return y + 1


@case(x48)
def try_finally(x):
    try:
        y = x.sin()
    finally:
        z = 1
    return y + z


@case(x48)
def try_except_else(x):
    try:
        y = x + 1
    except (ValueError, TypeError):
        y = x - 1
    else:
        y = y * 3
    return y


@case(lambda: (rand(4, 8).requires_grad_(),))
def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return x + y


@case(x48)
def no_grad_inside_grad(x):
    with torch.no_grad():
        a = x.exp()
        with torch.enable_grad():
            b = x + 1
    return a + b


@case(x48)
def global_module(x):
    return GLOBAL_LINEAR(x)


@case(x48)
def global_function_table(x):
    return ACTS["gelu"](x) + ACTS["silu"](x)


@case(x48)
def functional_calls(x):
    return F.softmax(x, dim=-1) + F.layer_norm(x, (8,)) + F.relu(x) + F.dropout(x, p=0.5, training=False)


@case(x48)
def del_and_pass(x):
    y = x + 1
    del x
    pass
    return y


@case(x48)
def math_constant_global(x):
    return x * math.pi + math.e


@case(x48)
def torch_constants(x):
    return x.clamp(min=-math.inf, max=torch.finfo(torch.float32).max) + torch.pi


@case(x48)
def augmented_assignments(x):
    y = x.clone()
    y += 1
    y *= 2
    y -= x
    y /= 3
    z = 5
    z //= 2
    z **= 2
    return y + z


@case(xy48)
def inplace_methods_on_intermediates(x, y):
    z = x + y
    z.mul_(2).add_(1)
    z.relu_()
    return z


@case(x48)
def with_grad_disabled_decorated_callee(x):
    return _no_grad_helper(x) + 1


@torch.no_grad()
def _no_grad_helper(x):
    return x * 2


@case(x48)
def sdpa_call(x):
    q = x.view(1, 2, 2, 8)
    return F.scaled_dot_product_attention(q, q, q, is_causal=True)


@case(x48)
def conditional_import_free(x):
    act = getattr(F, "relu")
    return act(x)


class Cfg:
    hidden = 8
    act = "silu"


@case(x48)
def plain_class_attributes(x):
    return ACTS[Cfg.act](x) * Cfg.hidden


class Config:
    def __init__(self, hidden, dropout, names):
        self.hidden = hidden
        self.dropout = dropout
        self.names = names

    def use_dropout(self):
        return self.dropout > 0


CONFIG = Config(8, 0.0, ["a", "b"])


@case(x48)
def plain_object_attributes(x):
    if CONFIG.use_dropout():
        x = F.dropout(x, CONFIG.dropout)
    return x * CONFIG.hidden + len(CONFIG.names)


@case(lambda: (rand(4, 8), Config(4, 0.5, ["x"])))
def object_argument(x, cfg):
    return x[:, :cfg.hidden] * cfg.dropout
