"""Trace-time Python that encoder, encoder-decoder and vision models run around their tensors
(inspect.signature of bound methods, id(), copies of configs, ModelOutput reads, dict views,
several *-unpacks, Tensor.new with a size): evaluated at trace time, guarded, no break.
Each case must match eager, not break, and not recompile on a second call with fresh inputs;
the guard tests show a changed input recompiles and still matches eager."""
import collections
import copy
import inspect

import pytest
import torch

import kiln
from tests.capture.resume_helpers import BACKENDS, _clone, run_both

transformers = pytest.importorskip("transformers")

CASES = []


def case(args=lambda: (torch.randn(3, 4),)):
    def deco(fn):
        CASES.append(pytest.param(fn, args, id=fn.__name__))
        return fn
    return deco


# ---------------------------------------------------------------- inspect
class Block:
    def chunk(self, a, b=2):
        return a * b

    def apply(self, fn, *inputs):
        # transformers' apply_chunking_to_forward
        n = len(inspect.signature(fn).parameters)
        if n != len(inputs):
            raise ValueError(n)
        return fn(*inputs)


BLOCK = Block()


@case()
def signature_of_bound_method(x):
    return BLOCK.apply(BLOCK.chunk, x, 3)


@case()
def signature_parameters_read(x):
    sig = inspect.signature(Block.chunk)
    names = list(sig.parameters)
    p = sig.parameters["b"]
    empty = sig.parameters["a"].default is inspect.Parameter.empty
    kind = p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
    return x * p.default + len(names) + empty + kind, names


@case()
def signature_of_lambda_with_default(x):
    f = lambda a, k=4: a + k  # noqa: E731
    return x + inspect.signature(f).parameters["k"].default


@case()
def parameter_made_and_signature_replaced(x):
    p = inspect.Parameter("z", inspect.Parameter.KEYWORD_ONLY, default=5)
    sig = inspect.signature(Block.chunk).replace(parameters=[p])
    return x * sig.parameters["z"].default, str(sig)


@case()
def bound_method_func_and_self(x):
    m = BLOCK.chunk
    same = m.__self__ is BLOCK and m.__func__ is Block.chunk
    return m.__func__(BLOCK, x) + same


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def ff(self, h):
        return torch.relu(self.lin(h))

    def forward(self, x):
        fn = self.ff
        n = len(inspect.signature(fn.__func__).parameters)  # self included
        return fn(x) * n


NET = Net()


@case()
def module_method_signature_through_func(x):
    return NET(x)


# ---------------------------------------------------------------- id()
@case()
def id_of_made_and_input_objects(x):
    a, b = [1], [1]
    memo = {id(a): "a"}
    return x + (id(a) == id(a)) + (id(a) != id(b)) + (id(b) in memo), memo[id(a)]


@case()
def id_of_module_in_memo(x):
    memo = {id(NET.lin): 2}
    return x * memo.get(id(NET.lin), 0)


# ---------------------------------------------------------------- copies
def _config():
    return transformers.BertConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=2)


CONFIG = _config()


@case()
def deepcopy_of_config_written_and_read(x):
    c = copy.deepcopy(CONFIG)
    c.num_hidden_layers = 5  # the copy changes, the original does not
    setattr(c, "hidden_size", 7)
    return x * c.num_hidden_layers + c.hidden_size + CONFIG.num_hidden_layers


@case()
def deepcopy_then_to_dict(x):
    c = copy.deepcopy(CONFIG)
    d = c.to_dict()
    return x + d["num_hidden_layers"] + len([k for k in d if k.startswith("num_")])


@case()
def copy_of_containers(x):
    a = [1, [2, 3]]
    b = copy.copy(a)
    c = copy.deepcopy(a)
    b[1].append(4)
    c[1].append(5)
    return x + len(a[1]) + len(c[1]), a, b, c


class Plain:
    def __init__(self, k):
        self.k = k
        self.items = [k]


PLAIN = Plain(3)


@case()
def copy_of_plain_object(x):
    shallow = copy.copy(PLAIN)
    deep = copy.deepcopy(PLAIN)
    shallow.k = 10
    deep.items.append(9)
    delattr(deep, "k")
    return x * PLAIN.k + shallow.k + len(deep.items) + len(PLAIN.items) + hasattr(deep, "k")


# ---------------------------------------------------------------- ModelOutput / OrderedDict
@case()
def model_output_built_and_read(x):
    out = transformers.modeling_outputs.BaseModelOutputWithPooling(last_hidden_state=x, pooler_output=x * 2)
    keys = list(out.keys())
    total = sum(v.sum() for v in out.values())
    pairs = [k for k, _ in out.items()]
    return out[0] + out["pooler_output"] + out.to_tuple()[1] + total, keys, pairs, len(out.to_tuple())


@case()
def ordered_dict_built_and_read(x):
    d = collections.OrderedDict()
    d["a"] = x
    d["b"] = x * 2
    return d["b"] + len(d), list(d.keys()), list(d.values())[0], d


@case(lambda: (torch.randn(3), collections.OrderedDict(a=1, b=2)))
def ordered_dict_input_read_and_written(x, d):
    d["c"] = 3
    return x + sum(d.values()), type(d).__name__


# ---------------------------------------------------------------- issue 24's wrong answers
@case(lambda: (torch.randn(3), [torch.randn(2), 1], (torch.randn(2),)))
def star_unpacks_into_tuple(x, a, b):
    t = (*a, *b)
    return t, len(t), x + len((*a, *b, *a))


@case(lambda: (torch.randn(3), (1, 2), [3]))
def star_unpacks_into_list(x, a, b):
    t = [*a, *b]
    return t, x + sum([*a, *b]), [*x.shape, *a]


@case()
def dict_views_stay_live(x):
    d = {"a": x}
    k, v, it = d.keys(), d.values(), d.items()
    d["b"] = x * 2
    out = x
    for t in v:
        out = out + t
    return out, list(k), len(it), "b" in k, sorted(k & {"b", "z"}), dict(it)["b"]


@case(lambda: (torch.randn(3), {"a": 1}))
def dict_view_of_an_input_dict(x, d):
    k = d.keys()
    d["new"] = 2
    return x + len(k), list(k)


@case(lambda: (torch.randn(2, 3, 4),))
def tensor_new_with_a_size(x):
    a = x.new(x.shape).fill_(1)
    b = x.new(torch.Size([2, 3]))
    c = x.new(2, 3)
    d = x.new([2, 3])  # a list is data
    return a + x, b.shape, c.shape, d, x.new().shape


@case(lambda: (torch.randn(2, 3, 4),))
def size_arithmetic(x):
    s = x.shape
    flat = s[:1] + (s[1] * s[2],)
    return x.reshape(flat), s + (1,), torch.Size([1]) + s, s[-2:], s.numel()


# ---------------------------------------------------------------- vision bits
POOL = torch.nn.AdaptiveAvgPool1d(3)


@case(lambda: (torch.randn(2, 6, 8),))
def adaptive_avg_pool1d(x):
    return torch.nn.functional.adaptive_avg_pool1d(x, 1), POOL(x)


@case(lambda: (torch.randn(4, 5, 6), torch.tensor([0, -1, 2]), torch.tensor([1, 4, 2], dtype=torch.int32)))
def index_with_two_tensors(x, i, j):
    return x[i, j], x[:, i, j], x[torch.arange(x.shape[0]), x.sum(-1).argmax(-1)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, args", CASES)
def test_trace_time_python(fn, args, backend, capsys):
    compiled = kiln.compile(fn, backend=backend)
    run_both(fn, compiled, args(), capsys)
    run_both(fn, compiled, args(), capsys)
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0 and stats["recompiles"] == 0 and stats["fallbacks"] == 0, stats
    explained = kiln.explain(fn, backend="eager")(*_clone(args()))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


# ---------------------------------------------------------------- guards
def test_id_of_an_input_object_is_guarded_by_identity():
    marked = Plain(1)

    def fn(x, obj):
        return x + (id(obj) == id(marked))

    compiled = kiln.compile(fn, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, marked), x + 1)
    torch.testing.assert_close(compiled(x, Plain(1)), x)  # another object: another answer
    assert kiln.stats()["recompiles"] == 1


def test_deepcopy_guards_what_it_read():
    cfg = _config()

    def fn(x):
        c = copy.deepcopy(cfg)
        return x * c.num_hidden_layers

    compiled = kiln.compile(fn, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 2)
    cfg.num_hidden_layers = 4  # the copy reads the new value
    torch.testing.assert_close(compiled(x), x * 4)
    assert kiln.stats()["recompiles"] == 1


def test_signature_of_a_made_function_guards_its_defaults():
    def fn(x, f):
        return x + inspect.signature(f).parameters["k"].default

    def maker(k):
        return lambda a, k=k: a + k

    compiled = kiln.compile(fn, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, maker(1)), x + 1)
    torch.testing.assert_close(compiled(x, maker(5)), x + 5)  # its default changed
