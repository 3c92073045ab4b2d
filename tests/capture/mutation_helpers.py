"""Shared check for the in-place tests: run fn eagerly and compiled on equal copies of the
inputs, compare the results and every input afterwards (the side effects)."""
import torch

import kiln
from testing import assert_close


def clone_args(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def check_mutation(fn, make_args, backend, calls=2, dtype=None):
    """fn compiled with fullgraph=True matches eager, results and inputs, on `calls` fresh
    argument sets (the second call runs the cached entry)."""
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for _ in range(calls):
        args = make_args()
        eager_args = clone_args(args)
        expected = fn(*eager_args)
        actual = compiled(*args)
        _compare(actual, expected, dtype)
        for a, e in zip(args, eager_args):
            if isinstance(e, torch.Tensor):
                _compare(a, e, dtype)
    return compiled


def _compare(actual, expected, dtype):
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _compare(a, e, dtype)
    elif isinstance(expected, torch.Tensor):
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        assert_close(actual, expected, dtype or expected.dtype)
    else:
        assert actual == expected
