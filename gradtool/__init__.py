"""gradtool: verify the gradients of custom torch.autograd Functions (public API only)."""

from __future__ import annotations

from ._version import __version__

__all__ = ["__version__", "assert_gradients", "check", "gradcheck", "gradgradcheck", "sample"]


def __getattr__(name: str):
    # Lazy: importing gradtool must not import torch (the CLI's --help stays fast).
    if name in ("check", "assert_gradients", "sample"):
        from . import api

        return getattr(api, name)
    if name in ("gradcheck", "gradgradcheck"):
        from . import dropin

        return getattr(dropin, name)
    raise AttributeError(f"module 'gradtool' has no attribute {name!r}")
