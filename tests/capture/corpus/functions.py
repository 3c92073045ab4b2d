"""Calls of user functions (inlined): closures, free variables, nonlocal, *args/**kwargs,
defaults, keyword-only args, lambdas, decorators, functools.partial, recursion."""
import functools

import torch

from corpus import Call, case, rand, x48, xy48, xb


def helper(x, scale=2.0, *, shift=1.0):
    return x * scale + shift


@case(x48)
def call_with_defaults(x):
    return helper(x) + helper(x, 3.0) + helper(x, shift=-1.0)


@case(lambda: Call((rand(4, 8),), {"shift": 0.5}))
def kwonly_arg(x, *, shift=0.0, scale=1.0):
    return x * scale + shift


@case(lambda: Call((rand(4, 8), rand(4, 8), rand(4, 8)), {}))
def star_args(*xs):
    out = xs[0]
    for t in xs[1:]:
        out = out + t
    return out * len(xs)


@case(lambda: Call((rand(4, 8),), {"a": rand(4, 8), "b": rand(8)}))
def star_kwargs(x, **kw):
    for k in sorted(kw):
        x = x + kw[k]
    return x


def _varargs(*args, **kwargs):
    return sum(args) * kwargs.get("scale", 1)


@case(xy48)
def call_star_args(x, y):
    parts = (x, y)
    opts = {"scale": 3}
    return _varargs(*parts, **opts) + _varargs(x, *parts, scale=2)


@case(xy48)
def closure_read(x, y):
    k = 4

    def inner(t):
        return t * k + y

    return inner(x) + inner(y)


@case(x48)
def closure_nonlocal(x):
    count = 0

    def bump(t):
        nonlocal count
        count += 1
        return t + count

    x = bump(x)
    x = bump(x)
    return x * count


@case(x48)
def closure_over_tensor_nonlocal(x):
    acc = x

    def add(t):
        nonlocal acc
        acc = acc + t

    add(x)
    add(x * 2)
    return acc


def make_scaler(s):
    def scale(t):
        return t * s
    return scale


SCALE3 = make_scaler(3.0)


@case(x48)
def global_closure(x):
    return SCALE3(x) + make_scaler(0.5)(x)


@case(x48)
def lambda_call(x):
    f = lambda t, k=2: t.relu() * k  # noqa: E731
    return f(x) + f(x, k=3)


@case(x48)
def nested_def_with_default(x):
    def g(t, p=x.shape[1]):
        return t / p
    return g(x)


def twice(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * 2
    return wrapper


@twice
def doubled(x):
    return x + 1


@case(x48)
def decorated_callee(x):
    return doubled(x)


@case(x48)
def functools_partial(x):
    f = functools.partial(helper, scale=0.5)
    return f(x)


def _fact(n):
    return 1 if n <= 1 else n * _fact(n - 1)


@case(x48)
def recursion_on_constants(x):
    return x * _fact(4)


def _depth(x, n):
    if n == 0:
        return x
    return _depth(x.tanh(), n - 1)


@case(x48)
def recursion_on_tensors(x):
    return _depth(x, 3)


@case(xb)
def broadcast_args_to_callee(x, b):
    return helper(x, scale=b)


@case(x48)
def keyword_call_of_torch(x):
    return torch.sum(input=x, dim=1, keepdim=True) + torch.clamp(x, min=-0.5, max=0.5)


@case(x48)
def star_unpack_into_torch(x):
    dims = (1, 0)
    return x.permute(*dims).contiguous()


@case(xy48)
def function_as_argument(x, y):
    def apply(f, *ts):
        return [f(t) for t in ts]
    return apply(torch.sigmoid, x, y)


@case(x48)
def immediately_called_closure_chain(x):
    def outer(a):
        def middle(b):
            def inner(c):
                return a + b + c
            return inner
        return middle
    return outer(x)(1.0)(2.0)
