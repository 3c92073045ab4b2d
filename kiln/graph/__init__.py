"""The FX-like stage: Node, Graph, printing as runnable Python, the reference interpreter."""
from kiln.graph.graph import Graph, getitem
from kiln.graph.node import Node
from kiln.graph.passes import cse, dce
from kiln.graph.proxy import Proxy
from kiln.graph.verify import GraphVerificationError, verify

__all__ = ["Graph", "Node", "Proxy", "dce", "cse", "verify", "GraphVerificationError", "getitem"]
