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
        seed_all(seed)
        yield


def seed_all(seed: int) -> None:
    """torch.manual_seed(seed) for the generators a forward can draw from: the CPU's and every
    CUDA device's. Without a CUDA device, the CPU's alone: torch.manual_seed also queues the
    seed for each accelerator not initialised (CUDA, XPU, MTIA), formatting the Python stack
    for each (~1-3 ms a call, more than a tiny drop-in call's whole check)."""
    if torch.cuda.is_available():
        torch.manual_seed(seed)  # seeds the initialised devices, queues it for the others
    else:
        torch.default_generator.manual_seed(seed)


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
