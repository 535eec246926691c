"""Placement: each tensor gradtool hands the target sits on the device of the one it stands for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def same_devices(made: Sequence[Any], theirs: Sequence[Any], what: str) -> None:
    """A tensor gradtool made lives on the device of the one it stands beside (an input's
    value, an output's grad_output); else a RuntimeError raised here, in gradtool's frame:
    an internal error (exit 3), not the target's."""
    for k, (mine, user) in enumerate(zip(made, theirs)):
        if (isinstance(mine, torch.Tensor) and isinstance(user, torch.Tensor)
                and mine.device != user.device):
            raise RuntimeError(f"gradtool made a {what} {k} on {mine.device} for a tensor on "
                               f"{user.device}: every tensor gradtool makes must live on its "
                               f"target's device")
