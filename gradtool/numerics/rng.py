"""The random number generators held still around a stochastic forward's evaluations: torch's
(every initialised CUDA generator too), numpy's global one and Python's `random`, each seeded
alike every time and given back as it was after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def frozen_rng(seed: int) -> Iterator[None]:
    # manual_seed seeds every CUDA generator: each initialised one is forked (the user's RNG
    # state is theirs; CPU arguments do not keep a forward from drawing on a GPU).
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices), _other_rngs_frozen(seed):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def _other_rngs_frozen(seed: int) -> Iterator[None]:
    """numpy's global RNG and Python's `random` seeded too, and their states given back after:
    a forward drawing its dropout mask from np.random is as stochastic as one drawing from
    torch's (it read as a forward drifting under a frozen RNG)."""
    import random

    import numpy as np

    numpy_state, python_state = np.random.get_state(), random.getstate()
    np.random.seed(seed % 2**32)
    random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
