"""kiln's max-flow (autograd/maxflow.py) against networkx: the same flow value and the same
cut (networkx's minimum_cut: the sink side is what still reaches the sink in the residual graph)
on random graphs shaped like the partitioner's (a source, a sink, node pairs joined by a
capacity, infinite edges elsewhere), and on small hand-made ones."""
import random

import pytest

from kiln.autograd.maxflow import FlowGraph, minimum_cut

nx = pytest.importorskip("networkx")


def _both(n_nodes, edges, s, t):
    g = FlowGraph()
    for _ in range(n_nodes):
        g.node()
    h = nx.DiGraph()
    h.add_nodes_from(range(n_nodes))
    for u, v, c in edges:
        g.edge(u, v, c)
        if h.has_edge(u, v):
            h[u][v]["capacity"] += c
        else:
            h.add_edge(u, v, capacity=c)
    value, side = minimum_cut(g, s, t)
    nx_value, (nx_side, _) = nx.minimum_cut(h, s, t)
    return value, side, nx_value, nx_side


def test_a_diamond():
    # s -> a (3), s -> b (2), a -> t (2), b -> t (3), a -> b (1)
    value, side, nx_value, nx_side = _both(4, [(0, 2, 3), (0, 3, 2), (2, 1, 2), (3, 1, 3), (2, 3, 1)], 0, 1)
    assert value == nx_value == 5 and side == nx_side


def test_no_path_means_no_flow():
    value, side, nx_value, nx_side = _both(3, [(0, 2, 4)], 0, 1)
    assert value == nx_value == 0 and side == nx_side == {0, 2}


@pytest.mark.parametrize("seed", range(40))
def test_partition_shaped_graphs_match_networkx(seed):
    rng = random.Random(seed)
    k = rng.randint(2, 60)  # values; value i is nodes (2 + 2i, 3 + 2i)
    inf = 10 ** 9
    edges = []
    for i in range(k):
        n_in, n_out = 2 + 2 * i, 3 + 2 * i
        edges.append((n_in, n_out, rng.choice([inf, rng.randint(1, 64) * 8 + rng.randint(0, 4)])))
        if i == 0 or rng.random() < 0.2:
            edges.append((0, n_in, inf))  # a primal, or a value that cannot be recomputed
        for j in rng.sample(range(i), min(i, rng.randint(0, 3))):
            edges.append((3 + 2 * j, n_in, inf))
        if rng.random() < 0.3 or i == k - 1:
            edges.append((n_out, 1, inf))  # the backward reads it
    value, side, nx_value, nx_side = _both(2 + 2 * k, edges, 0, 1)
    assert value == nx_value
    assert side == nx_side
