"""The op vocabularies: core ops (captured graphs) and prims (lowering input)."""
from kiln.ops import core, prims  # noqa: F401  (defines the ops)
from kiln.ops import decompositions  # noqa: F401  (registers the rules)
from kiln.ops import attention  # noqa: F401  (fused attention for training)
from kiln.ops import conv  # noqa: F401  (convolution's backward as one library call)
from kiln.ops.registry import DECOMPOSITIONS, LOWERINGS, META_RULES, VJP_RULES, MissingRule, Op

__all__ = ["core", "prims", "Op", "MissingRule", "META_RULES", "DECOMPOSITIONS", "LOWERINGS", "VJP_RULES"]
