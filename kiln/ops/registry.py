"""The op registry is ``kiln/graph/registry.py``: an op is a graph node's target, so the registry
sits with the graph, below the op vocabularies. This name is the same module (the op files and
the stages import it from here)."""
import sys

from kiln.graph import registry as _registry

sys.modules[__name__] = _registry
