"""The FakeTensor stage's data: metadata (shape, stride, dtype, device) without data.

Propagation over a graph (``kiln.graph.propagate``) and its verifier (``kiln.graph.verify_meta``)
sit in the graph package: they walk nodes, and the graph sits above the metas its nodes hold.
"""
from kiln.meta.tensor_meta import TensorMeta, contiguous_strides

__all__ = ["TensorMeta", "contiguous_strides"]
