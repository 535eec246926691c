"""torch's vmap fallback warnings kept quiet around gradtool's own batched evaluations."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

FALLBACK = "There is a performance drop because we have not yet implemented the batching rule"


_FALLBACK_WARNS = [True]  # torch's vmap fallback warning: on until silence_vmap_fallback


def silence_vmap_fallback(enabled: bool = False) -> None:
    """torch prints "There is a performance drop because we have not yet implemented the
    batching rule for ns::op" (from C++, once per op) when gradtool's own batched evaluations
    meet an op without a vmap rule: noise in a report, and not the user's vmap. torch cannot
    read the switch back, so its state is kept here for quiet_batching."""
    torch._C._functorch._set_vmap_fallback_warning_enabled(enabled)
    _FALLBACK_WARNS[0] = enabled


@contextlib.contextmanager
def quiet_batching(legacy: bool = False) -> Iterator[None]:
    """torch's batching-fallback warnings silenced: they are about gradtool's own batched
    evaluations (a per-sample loop is what the user would run), noise in a report. Where
    torch's switches already keep them quiet (the library and the workers turn vmap's off; the
    legacy vmap's is off unless its debug switch is on) the filters stay untouched, since
    catch_warnings makes Python forget which warnings it showed once (torch's gradcheck notice
    would then print, ~4 ms, on every drop-in call)."""
    quiet = not torch._C._debug_only_are_vmap_fallback_warnings_enabled() if legacy \
        else not _FALLBACK_WARNS[0]
    if quiet:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=FALLBACK)
        yield
