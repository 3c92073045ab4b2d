"""The FakeTensor stage: metadata (shape, stride, dtype, device) without data."""
from kiln.meta.tensor_meta import TensorMeta, contiguous_strides
from kiln.meta.propagate import propagate_meta

__all__ = ["TensorMeta", "contiguous_strides", "propagate_meta"]
