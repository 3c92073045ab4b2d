"""Proxy: a stand-in for a tensor while a graph is being built.

Decompositions, VJP rules and capture all build graphs the same way: they call ops on
Proxies, and ``Op.__call__`` records a node into the proxy's graph, computing its meta.
"""
from __future__ import annotations

import threading

from kiln.graph.node import flatten_args


class Proxy:
    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node

    @property
    def graph_builder(self):
        return self.node.graph

    @property
    def meta(self):
        return self.node.meta["val"]

    @property
    def shape(self):
        return self.meta.shape

    @property
    def dtype(self):
        return self.meta.dtype

    @property
    def device(self):
        return self.meta.device

    @property
    def ndim(self):
        return self.meta.ndim

    def dim(self):
        return self.meta.ndim

    def size(self, d=None):
        return self.meta.shape if d is None else self.meta.shape[d]

    def stride(self, d=None):
        return self.meta.stride if d is None else self.meta.stride[d]

    def numel(self):
        return self.meta.numel()

    def __repr__(self):
        return f"Proxy({self.node.name}: {self.meta})"

    def __bool__(self):
        raise TypeError(f"the truth value of a traced tensor ({self.node.name}) is not known "
                        "while building a graph; decompositions must not branch on data")


def find_proxy(args, kwargs):
    for a in flatten_args((args, kwargs)):
        if isinstance(a, Proxy):
            return a
    return None


_active = threading.local()


def active_graph():
    """The graph being built in this thread (for ops with no tensor arguments: rand, full)."""
    stack = getattr(_active, "stack", None)
    return stack[-1] if stack else None


def push_active(graph):
    if not hasattr(_active, "stack"):
        _active.stack = []
    _active.stack.append(graph)


def pop_active():
    _active.stack.pop()
