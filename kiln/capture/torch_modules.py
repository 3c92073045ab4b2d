"""Which Python modules are torch's own: capture treats their functions as torch functions
(the capture table, fallback nodes) instead of inlining them, and trusts their frames."""
from __future__ import annotations


def is_torch_module(name) -> bool:
    """``torch`` and its submodules, not libraries whose names merely start with "torch"
    (torchvision, torchaudio, torchmetrics): those are user code, inlined like any other."""
    name = name or ""
    return name == "torch" or name.startswith("torch.")
