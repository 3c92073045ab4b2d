"""kiln: a compiler for PyTorch programs."""
from kiln.config import config  # noqa: F401
