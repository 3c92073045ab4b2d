"""kiln as a ``torch.compile`` backend: ``torch.compile(m, backend="kiln")`` (the
``torch_dynamo_backends`` entry point in pyproject.toml) or ``backend=kiln.interop.backend``.

The one package in kiln that reads ``torch.fx`` / Dynamo objects (DESIGN.md section 5):
``fx_import`` turns Dynamo's GraphModule into a kiln Graph, ``backend`` compiles it with
kiln's own stages."""
from kiln.interop.backend import KilnGraphModule, backend

__all__ = ["backend", "KilnGraphModule"]
