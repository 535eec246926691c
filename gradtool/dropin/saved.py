"""A failing drop-in call's report, its hints made true where it is shown, and its inputs saved
on request.

The report's hints are the CLI's: a `--save-inputs` option, which neither a Python call nor
pytest takes. The drop-in's way is the environment variable GRADTOOL_SAVE_INPUTS=DIR (pytest:
`--gradtool-save-inputs DIR`, which sets it): each failing call's inputs are saved there with
torch.save as (args, {}) -- what `gradtool check ... --inputs-from FILE.pt` replays -- and the
report's `reproduce:` line names that file.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Any

from ..run.reproduce import REPLAY_VALUES, SAVE_INPUTS_ENV

ENV = SAVE_INPUTS_ENV
CLI_HINT = REPLAY_VALUES
DROPIN_HINT = (f"{REPLAY_VALUES}, or set {ENV}=DIR (pytest: --gradtool-save-inputs DIR) to save "
               "each failing call's inputs there")
_NUMBERS = itertools.count(1)


def plain_report(report: Any) -> str:
    """The plain report of a drop-in call, its CLI-only hint told the drop-in's way."""
    from ..render.terminal import render_plain

    return render_plain(report, quiet=True).replace(CLI_HINT, DROPIN_HINT)


def with_saved_inputs(failure: Any, name: str, args: tuple[Any, ...]) -> Any:
    """failure, its message naming the saved inputs where GRADTOOL_SAVE_INPUTS asks for them
    (the `reproduce:` line's INPUTS.pt that file); failure as it is otherwise."""
    folder = os.environ.get(ENV)
    if not folder:
        return failure
    path = save(Path(folder), name, args)
    message = str(failure.args[0]) if failure.args else ""
    message = message.replace("--inputs-from INPUTS.pt", f"--inputs-from {path}")
    failure.args = (f"{message}\ninputs saved: {path} (torch.load(path) gives (args, kwargs))",)
    return failure


def save(folder: Path, name: str, args: tuple[Any, ...]) -> Path:
    """(args, {}) saved in folder under the function's name and a number; the path."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^\w.-]+", "_", name)
    path = folder / f"{name}-{os.getpid()}-{next(_NUMBERS)}.pt"
    values = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
    torch.save((values, {}), path)
    return path
