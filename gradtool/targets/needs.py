"""Which torch a torch feature the user's code imports needs: a hint instead of a bare ImportError."""

from __future__ import annotations

import re

# torch.library's entry points that custom-op code imports, with the oldest tested torch that has
# them (docs/compatibility.md). gradtool itself requires 2.4, where custom_op begins.
FEATURES = {f"torch.library.{name}": "2.4" for name in (
    "custom_op", "register_fake", "register_autograd", "opcheck", "infer_schema",
    "register_kernel", "CustomOpDef")}
FEATURES.update({"torch.library.triton_op": "2.6", "torch.library.wrap_triton": "2.6"})

_IMPORT = re.compile(r"cannot import name '(\w+)' from '(torch[\w.]*)'")
_ATTRIBUTE = re.compile(r"module '(torch[\w.]*)' has no attribute '(\w+)'")


def torch_needed(exc: BaseException) -> str | None:
    """'torch.library.triton_op is in torch 2.6, not in this torch 2.4.1', or None."""
    text = str(exc)
    if isinstance(exc, ImportError) and (found := _IMPORT.search(text)):
        feature = f"{found[2]}.{found[1]}"
    elif isinstance(exc, AttributeError) and (found := _ATTRIBUTE.search(text)):
        feature = f"{found[1]}.{found[2]}"
    else:
        return None
    if feature not in FEATURES:
        return None
    import torch

    return (f"{feature} is in torch {FEATURES[feature]} and later, not in this torch "
            f"{torch.__version__}: upgrade torch")
