"""Cases of PyTorch's test/dynamo/test_functions.py that kiln ran eagerly (issue 24's peer
figures), each made general: dicts keyed by input tensors (dict_keys.py), namedtuple classes
made in the frame, nested functions and closures across graph breaks. Each compares with
eager on fresh inputs and checks nothing ran eagerly."""
import collections

import pytest
import torch

import kiln


def _stats():
    return kiln.stats()


def _check(fn, *make_args, calls=2, breaks=0):
    """Compile ``fn``, call it on fresh inputs ``calls`` times, compare with eager."""
    compiled = kiln.compile(fn)
    for _ in range(calls):
        args = [m() for m in make_args]
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert _stats()["eager_runs"] == 0
    assert _stats()["graph_breaks"] == breaks
    return compiled


def _r44():
    return torch.randn(4, 4)


# ====================================================================== dicts keyed by tensors
def test_dict_keyed_by_a_closure_parameter():  # test_dict_param_keys
    a_param = torch.nn.Parameter(torch.ones([4, 4]))

    def fn(a):
        tmp = {"a": a, a_param: 3}
        return tmp["a"] + tmp[a_param]

    _check(fn, _r44)


def test_tensor_keys_get_pop_in_len_iteration():
    p, q = torch.nn.Parameter(torch.ones(4, 4)), torch.nn.Parameter(torch.full((4, 4), 2.0))

    def fn(a):
        d = {p: a * 2, "s": 1}
        d[q] = a + 1
        out = d.get(q) + d.get("zz", 0) + len(d)
        if p in d and "t" not in d:
            out = out + d.pop(p)
        for k in d:
            if isinstance(k, torch.Tensor):
                out = out + k
        for k, v in d.items():
            if k is q:
                out = out * v
        d.setdefault(p, a)
        return out + d[p] + sum(1 for _ in d.keys())

    _check(fn, _r44)


def test_tensor_keys_of_one_dict_that_are_one_object_next_call():
    # {x: 1, y: 2} has two keys for two tensors, one for one tensor passed twice
    def fn(x, y):
        d = {x: 1, y: 2}
        return x * len(d) + d[x]

    compiled = kiln.compile(fn)
    x, y = _r44(), _r44()
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    torch.testing.assert_close(compiled(x, x), fn(x, x))
    x2 = _r44()
    torch.testing.assert_close(compiled(x2, x2), fn(x2, x2))
    assert _stats()["eager_runs"] == 0 and _stats()["recompiles"] == 1


def test_lookup_miss_by_a_distinct_tensor_is_guarded():
    def fn(x, y):
        d = {x: 1}
        return x + (10 if y in d else 0)

    compiled = kiln.compile(fn)
    x, y = _r44(), _r44()
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    torch.testing.assert_close(compiled(x, x), fn(x, x))
    assert _stats()["eager_runs"] == 0


def test_tensor_keyed_dict_returned_keeps_the_input_objects():
    p = torch.nn.Parameter(torch.ones(2, 2))

    def fn(x):
        return {p: x + 1, "k": x * 2}

    compiled = kiln.compile(fn)
    for _ in range(2):
        x = torch.randn(2, 2)
        out = compiled(x)
        assert list(out)[0] is p and out["k"].shape == (2, 2)
        torch.testing.assert_close(out[p], x + 1)
    assert _stats()["eager_runs"] == 0


def test_tensor_key_written_into_an_input_dict():
    p = torch.nn.Parameter(torch.ones(2, 2))
    state = {"n": 0}

    def fn(x):
        state[p] = x * 3
        return x + 1

    compiled = kiln.compile(fn)
    x = torch.randn(2, 2)
    compiled(x)
    assert list(state) == ["n", p]
    torch.testing.assert_close(state[p], x * 3)
    assert _stats()["eager_runs"] == 0 and _stats()["graph_breaks"] == 0


def test_input_dict_keyed_by_tensors():
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.zeros(3))

    def fn(d, x):
        out = x
        for k, v in d.items():
            out = out + k * v
        return out + d[p]

    compiled = kiln.compile(fn)
    for _ in range(2):
        d, x = {p: torch.randn(3), q: torch.randn(3)}, torch.randn(3)
        torch.testing.assert_close(compiled(d, x), fn(d, x))
    assert _stats()["eager_runs"] == 0


def test_tensor_keyed_dict_across_a_graph_break():
    p = torch.nn.Parameter(torch.ones(4, 4))

    def fn(a):
        d = {p: a + 1, "a": a}
        print("break")
        return d[p] * d["a"]

    _check(fn, _r44, breaks=1)


def test_a_computed_tensor_as_a_key_is_a_clear_break():
    def fn(a):
        b = a + 1
        d = {b: 1}
        return b * len(d)

    compiled = kiln.compile(fn)
    x = _r44()
    with pytest.warns(RuntimeWarning, match="computed in the traced code as a dict key"):
        torch.testing.assert_close(compiled(x), fn(x))


# ====================================================================== namedtuple classes
def _r3():
    return torch.randn(3)


def test_namedtuple_class_made_in_the_frame():  # test_namedtuple
    def fn(a, b):
        mytuple = collections.namedtuple("mytuple", ["x", "y", "xy"])
        tmp = mytuple(a, b, a + b)
        return mytuple(tmp.x, tmp[1], tmp.xy + b)

    compiled = _check(fn, _r3, _r3)
    out = compiled(_r3(), _r3())
    assert type(out).__name__ == "mytuple" and type(out)._fields == ("x", "y", "xy")
    assert type(out).__module__ == __name__


def test_namedtuple_class_with_defaults():  # test_namedtuple_defaults
    def fn(a, b):
        mytuple = collections.namedtuple("mytuple", ["x", "y", "xy"], defaults=(None, 1, None))
        tmp = mytuple(a, xy=b)
        return mytuple(tmp.x, tmp[1], tmp.xy + b)

    _check(fn, _r3, _r3)


def test_namedtuple_fields_from_an_argument_are_guarded():
    def fn(a, names):
        cls = collections.namedtuple("T", names)
        t = cls(*([a] * len(names)))
        return t[0] * len(t._fields), type(t)._fields

    compiled = kiln.compile(fn)
    for names in (["p", "q"], ["p", "q"], ["u", "v", "w"]):
        a = _r3()
        out, ref = compiled(a, names), fn(a, names)
        torch.testing.assert_close(out[0], ref[0])
        assert out[1] == ref[1]
    assert _stats()["eager_runs"] == 0 and _stats()["recompiles"] == 1


def test_typing_namedtuple_functional_form_across_a_break():
    import typing

    def fn(a):
        Pair = typing.NamedTuple("Pair", [("left", torch.Tensor), ("right", int)])
        p = Pair(a * 2, 3)
        print("break")
        return p.left + p.right, p

    compiled = kiln.compile(fn)
    a = _r3()
    out, ref = compiled(a), fn(a)
    torch.testing.assert_close(out[0], ref[0])
    assert type(out[1]).__name__ == "Pair" and out[1].right == 3
    assert _stats()["eager_runs"] == 0 and _stats()["graph_breaks"] == 1


def test_a_namedtuple_call_that_raises_raises_as_in_eager():
    def fn(a):
        collections.namedtuple("bad", ["1x"])
        return a + 1

    with pytest.raises(ValueError):
        kiln.compile(fn)(_r3())


# ====================================================================== closures
def test_nested_closure_returned_from_the_frame():  # test_complex_closure
    def forward(y):
        def a():
            def x(z):
                return y + z
            return x
        return a()

    compiled = kiln.compile(forward)
    for _ in range(2):
        y, z = _r3(), _r3()
        torch.testing.assert_close(compiled(y)(z), forward(y)(z))
    assert _stats()["eager_runs"] == 0 and _stats()["graph_breaks"] == 0
    assert _stats()["frames_compiled"] == 1


def test_returned_closures_share_their_cell_per_call():
    def make(x):
        total = x * 2

        def add(t):
            nonlocal total
            total = total + t
            return total

        def read():
            return total
        return add, read

    compiled = kiln.compile(make)
    for _ in range(2):
        x, t = _r3(), _r3()
        add, read = compiled(x)
        add(t)
        torch.testing.assert_close(read(), x * 2 + t)
        assert add.__closure__[0] is read.__closure__[0]
    add2, read2 = compiled(_r3())
    assert add2.__closure__[0] is not add.__closure__[0]  # a new cell per call, as in eager
    assert _stats()["eager_runs"] == 0


def test_closure_breaking_inside_sees_a_cell_rebound_after_the_break():  # test_non_inlined_closure
    def program(x, y):
        one = lambda x, y: x + y  # noqa: E731

        def inner():
            kiln.graph_break()
            return one(x, y)

        res = inner()
        one = lambda x, y: x - y  # noqa: E731
        res += inner()
        return res

    compiled = kiln.compile(program)
    for _ in range(3):
        x, y = torch.randn(1), torch.randn(1)
        torch.testing.assert_close(compiled(x, y), program(x, y))
    assert _stats()["eager_runs"] == 0
    compiled_before = _stats()["frames_compiled"]
    compiled(torch.randn(1), torch.randn(1))  # every frame a cache hit: closures cache by code
    assert _stats()["frames_compiled"] == compiled_before


def test_partial_in_a_cell_across_a_break():  # test_partial_across_graph_break_uninvoked
    import functools

    def bar(x, **kwargs):
        return x + x + len(kwargs)

    def foo(x, i):
        def inner():
            print("a graph break")
            return op(x)

        op = functools.partial(bar, dim=10)
        x = inner()
        op = functools.partial(bar, other=10, more=1)
        return inner() + x

    compiled = kiln.compile(foo, dynamic=True)
    for _ in range(2):
        x = torch.rand(1)
        torch.testing.assert_close(compiled(x, 10), foo(x, 10))
    assert _stats()["eager_runs"] == 0


def test_closure_made_before_a_break_called_after_it():
    def fn(x):
        scale = 2

        def f(t):
            return t * scale

        print("break")
        scale = 3
        return f(x)

    _check(fn, _r3, breaks=1)


def test_nonlocal_written_before_a_break_resumes_compiled():
    def outer():
        y = None

        def inner(x):
            nonlocal y
            y = x * 2
            print("break")
            return y + 1
        return inner

    inner = outer()
    compiled = kiln.compile(inner)
    for _ in range(2):
        x = _r3()
        torch.testing.assert_close(compiled(x), x * 2 + 1)
        torch.testing.assert_close(inner.__closure__[0].cell_contents, x * 2)
    assert _stats()["eager_runs"] == 0


def test_closures_of_one_code_share_entries():
    def outer(w):
        def f(x):
            return x * w
        return f

    for k in range(3):
        f = outer(torch.full((3,), float(k)))
        x = _r3()
        torch.testing.assert_close(kiln.compile(f)(x), f(x))
    assert _stats()["frames_compiled"] == 1 and _stats()["eager_runs"] == 0


def test_a_closure_passed_in_that_breaks_is_the_one_of_each_call():
    # the glue called the first call's closure on every later call (a stale constant)
    def make(w):
        def g(x):
            print("break")
            return x * w
        return g

    def f(g, x):
        return g(x) + 1

    compiled = kiln.compile(f)
    x = torch.ones(2)
    for k in range(3):
        g = make(float(k))
        torch.testing.assert_close(compiled(g, x), f(g, x))
    assert _stats()["eager_runs"] == 0


def test_zero_argument_super_after_a_break():
    # super() reads the method's first argument and its __class__ cell, neither named in the
    # code after the break: the resume function keeps both (it resolved the wrong object before)
    class Base(torch.nn.Module):
        def forward(self, x):
            return x + 1

    class Child(Base):
        def forward(self, x):
            y = x * 2
            print("break")
            return super().forward(y) * 3

    m = Child()
    _check(m.forward, _r3, breaks=1)
