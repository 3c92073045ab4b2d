"""Trace-time Python that library code runs around its tensors (values_stdlib.py and friends):
each construct is evaluated at trace time, guarded where it read state, and costs no break.
Every test compares the compiled result with eager and asserts the graph/break counts."""
import contextlib
import dataclasses
import enum
import functools
import logging
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import assert_close


def _one_graph(fn, *args, **kwargs):
    out = kiln.explain(fn, backend="eager")(*args, **kwargs)
    assert (out.graph_count, out.graph_break_count) == (1, 0), [str(b) for b in out.break_reasons]
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    assert_close(compiled(*args, **kwargs), fn(*args, **kwargs))
    return compiled


# ---------------------------------------------------------------- os.environ
def _env_scaled(x):
    scale = 2.0 if os.environ.get("KILN_TEST_ENV_FLAG", "0") == "1" else 3.0
    if "KILN_TEST_ENV_FLAG" in os.environ:
        scale += float(os.environ["KILN_TEST_ENV_FLAG"])
    return x * scale + float(os.getenv("KILN_TEST_ENV_OTHER", "0.5"))


def test_environ_reads_are_guarded_constants(monkeypatch):
    monkeypatch.delenv("KILN_TEST_ENV_FLAG", raising=False)
    x = torch.randn(4)
    compiled = _one_graph(_env_scaled, x)
    assert_close(compiled(x), x * 3.0 + 0.5)
    monkeypatch.setenv("KILN_TEST_ENV_FLAG", "1")  # the guard re-reads it: a recompile
    assert_close(compiled(x), _env_scaled(x))
    assert_close(compiled(x), x * 3.0 + 0.5)  # 2.0 + 1.0
    monkeypatch.setenv("KILN_TEST_ENV_OTHER", "2")
    assert_close(compiled(x), x * 3.0 + 2.0)
    assert kiln.stats()["recompiles"] == 2


# ---------------------------------------------------------------- logging and warnings
_logger = logging.getLogger("kiln_test_trace_time")


def _logs(x):
    _logger.warning("scaling by %d", 3)
    return x * 3


def test_logger_call_replayed_on_every_call(caplog):
    x = torch.randn(4)
    compiled = _one_graph(_logs, x)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kiln_test_trace_time"):
        compiled(x)
        compiled(x)
    assert [r.getMessage() for r in caplog.records] == ["scaling by 3"] * 2  # as eager does


@functools.lru_cache(None)
def _warn_once(logger, msg):
    logger.warning(msg)


logging.Logger.kiln_test_warning_once = _warn_once  # as transformers adds warning_once


def _logs_once(x):
    _logger.kiln_test_warning_once("only once")
    return x + 1


def test_warning_once_happens_once(caplog):
    _warn_once.cache_clear()
    x = torch.randn(4)
    with caplog.at_level(logging.WARNING, logger="kiln_test_trace_time"):
        compiled = _one_graph(_logs_once, x)
        for _ in range(3):
            compiled(x)
    assert [r.getMessage() for r in caplog.records] == ["only once"]


def _warns(x):
    warnings.warn("kiln test: careful", UserWarning)
    return x - 1


def test_warnings_warn_names_the_user_line():
    x = torch.randn(4)
    kiln.reset()
    compiled = kiln.compile(_warns, backend="eager")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert_close(compiled(x), x - 1)
    assert [str(w.message) for w in seen] == ["kiln test: careful"]
    assert seen[0].filename == __file__ and seen[0].lineno == _warns.__code__.co_firstlineno + 1
    assert kiln.stats()["graph_breaks"] == 0


def test_logger_with_a_tensor_argument_breaks():
    def f(x):
        _logger.info("value %s", x)
        return x + 1
    out = kiln.explain(f, backend="eager")(torch.randn(3))
    assert out.graph_break_count == 1 and "non-constant" in out.break_reasons[0].reason


# ---------------------------------------------------------------- dict keys
class _Kind(enum.Enum):
    A = 1
    B = 2


_BY_TYPE = {torch.Tensor: 2.0, int: 3.0}
_BY_ENUM = {_Kind.A: 4.0, _Kind.B: 5.0}
_BY_FUNCTION = {torch.relu: "relu", torch.tanh: "tanh", F.gelu: "gelu"}


def _table_keys(x):
    act = [f for f, name in _BY_FUNCTION.items() if name == "tanh"][0]
    return act(x * _BY_TYPE[torch.Tensor] + _BY_ENUM[_Kind.B]) + _BY_TYPE.get(float, 0.25)


def test_dicts_keyed_by_types_enums_functions():
    x = torch.randn(4)
    compiled = _one_graph(_table_keys, x)
    _BY_ENUM[_Kind.B] = 6.0  # a value guard through the key's position
    try:
        assert_close(compiled(x), _table_keys(x))
    finally:
        _BY_ENUM[_Kind.B] = 5.0
    assert kiln.stats()["recompiles"] == 1


# ---------------------------------------------------------------- functools, contextlib, dataclasses
class _Act(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = functools.partial(F.gelu, approximate="tanh")  # transformers' GELUTanh

    def forward(self, x):
        return self.act(x)


def test_partial_reached_as_a_value():
    x = torch.randn(4, 8)
    _one_graph(_Act(), x)


@functools.lru_cache(None)
def _pure(n):
    return n * 3 + 1


def test_lru_cache_pure_function():
    _one_graph(lambda x: x * _pure(4), torch.randn(4))


def _decorated(fn):
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        return fn(*args, **kwargs) * 2
    return inner


@_decorated
def _doubled(x, bias=1.0):
    return x + bias


def test_functools_wraps_decorator():
    _one_graph(lambda x: _doubled(x, bias=0.5), torch.randn(4))


@contextlib.contextmanager
def _scaled(state, factor):
    state.append("enter")
    try:
        yield factor * 2
    finally:
        state.append("exit")


def test_contextmanager_block():
    def f(x):
        order = []
        with _scaled(order, 3) as s:
            y = x * s
            order.append("body")
        return y + len(order), order == ["enter", "body", "exit"]
    compiled = _one_graph(f, torch.randn(4))
    assert compiled(torch.randn(4))[1] is True


@dataclasses.dataclass
class _Cfg:
    width: int = 2
    scale: float = 1.5


_CFG = _Cfg()


def test_dataclasses_replace_and_getattr_default():
    def f(x):
        cfg = dataclasses.replace(_CFG, scale=2.5)
        return x * cfg.scale + getattr(cfg, "missing", 0.25) + getattr(cfg, "width", 9)
    _one_graph(f, torch.randn(4))


# ---------------------------------------------------------------- what decoder LLMs' helpers do
def test_broadcast_index_tensors_on_leading_dims():
    """transformers' padding mask: ``padding_mask[batch_idx, kv_idx]`` with index tensors that
    broadcast against each other (negative indices wrap), forward and gradient."""
    def f(x, i, j):
        return x[i, j] * 2
    x = torch.randn(3, 5, 2, requires_grad=True)
    i, j = torch.tensor([[0], [2], [-1]]), torch.tensor([[1, 4, -2]])
    _one_graph(f, x.detach(), i, j)
    kiln.reset()
    got = kiln.compile(f)(x, i, j)
    (grad,) = torch.autograd.grad(got.sum(), x)
    (want,) = torch.autograd.grad(f(x, i, j).sum(), x)
    assert_close(got, f(x, i, j))
    assert_close(grad, want)


# ---------------------------------------------------------------- sdpa as decoder LLMs call it
def test_sdpa_grouped_query_attention():
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    f = functools.partial(F.scaled_dot_product_attention, is_causal=True, enable_gqa=True)
    _one_graph(lambda q, k, v: f(q, k, v), q, k, v)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_with_dropout_in_distribution(causal):
    """dropout_p > 0: kiln's random mask, so compare the mean over many draws with no dropout,
    and p=1 (all dropped) exactly."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8) for _ in range(3))
    kiln.reset()
    f = kiln.compile(lambda q, k, v, p: F.scaled_dot_product_attention(
        q.expand(4000, 1, 4, 8), k, v, dropout_p=p, is_causal=causal), backend="eager")
    assert kiln.explain(f, backend="eager")(q, k, v, 0.5).graph_break_count == 0
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert_close(f(q, k, v, 1.0), torch.zeros(4000, 1, 4, 8))
    got = f(q, k, v, 0.5)
    assert not torch.allclose(got[0], got[1])  # dropout happened
    torch.testing.assert_close(got.mean(0, keepdim=True), plain, rtol=0, atol=0.1)


class _Rotary:
    """A class-level cache filled on first use, read through a property (rotary tables do this)."""
    _cache = {}

    def __init__(self, base):
        self.base = base

    @property
    def inv(self):
        return 1.0 / self.base

    def table(self, n):
        if n not in _Rotary._cache:
            _Rotary._cache[n] = n * self.inv
        return _Rotary._cache[n]


def test_class_level_cache_and_property():
    rot = _Rotary(4.0)
    _Rotary._cache.clear()
    compiled = _one_graph(lambda x: x * rot.table(3) + getattr(rot, "offset", 0.5), torch.randn(4))
    assert _Rotary._cache == {3: 0.75}  # the write is replayed into the real class dict
    assert_close(compiled(torch.ones(4)), torch.full((4,), 1.25))


_EXITS = []


@contextlib.contextmanager
def _pure_enter(scale):
    try:
        yield scale * 2
    finally:
        _EXITS.append("exit")


def _break_in_block(x):
    with _pure_enter(3) as s:
        y = x * s
        kiln.graph_break()
        y = y + 1
    return y * 2


def test_break_inside_contextmanager_block_resumes_compiled():
    """The glue enters a real manager again (the code before its yield did nothing kiln
    records), so the rest resumes compiled; its exit is one more break, run once per call."""
    x = torch.randn(4)
    out = kiln.explain(_break_in_block, backend="eager")(x)
    assert (out.graph_count, out.graph_break_count) == (3, 2), [str(b) for b in out.break_reasons]
    kiln.reset()
    compiled = kiln.compile(_break_in_block, backend="eager")
    want = _break_in_block(x)
    _EXITS.clear()
    for _ in range(2):
        assert_close(compiled(x), want)
    assert _EXITS == ["exit", "exit"]
