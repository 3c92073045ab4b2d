"""kiln's version: the one place it is written (pyproject.toml reads it: [tool.setuptools.dynamic])."""
__version__ = "0.1.0"
