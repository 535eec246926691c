"""The one `reproduce:` builder: the command that re-runs a case from its whole configuration."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

from ..config.registry import DEFAULT_CHECKS
from ..config.settings import CheckConfig
from ..targets.inputs import InputSpec
from ..targets.load import Target

class Job(Protocol):
    """What the builder reads of a run/runner.py Job (a Protocol: no import circle)."""

    target: Target
    config: CheckConfig
    reproduce: str | None   # a spec's own command


def reproduce_for(job: Job, specs: Sequence[InputSpec] | None, seed: int,
                  origin: str | None = None) -> str:
    """A spec's own command (its file holds the configuration), else the flags of the job's
    whole configuration: the runner's report and a worker's death notice both use it."""
    if job.reproduce:  # a spec: --trust-callables decides whether it may run at all
        return job.reproduce + (" --trust-callables" if job.config.trust_callables else "")
    return reproduce_command(job.target, specs or [], job.config, seed, origin)


def loadable_location(module_name: str) -> str:
    """What a `gradtool check` started in the working directory loads a module by: its dotted
    name where that imports there (an installed package, or one whose root is the working
    directory), else its file (the package's root is found from the file itself)."""
    import os
    import sys
    from pathlib import Path

    from ..targets.load import display_path, package_root

    file = getattr(sys.modules.get(module_name), "__file__", None)
    if not file or not file.endswith(".py") or os.sep + "site-packages" + os.sep in file \
            or os.sep + "dist-packages" + os.sep in file:
        return module_name
    root, dotted = package_root(Path(file).resolve())
    if dotted == module_name and root == Path.cwd().resolve():
        return module_name
    return display_path(file)


def pin_flags(specs: Sequence[InputSpec], config: CheckConfig) -> str:
    """'-i 3x4 -i 2.5': the flags that give these inputs explicitly. Trailing literals that no
    --input can write (a default such as torch.tanh: its repr is '<built-in ...>') are left
    out: forward's own default gives them."""
    texts = [_cli_input(spec, config) for spec in specs]
    while texts and _unwritable(specs[len(texts) - 1], texts[-1]):
        texts.pop()
    return " ".join(f"-i {shell_quote(text)}" for text in texts)


def _unwritable(spec: Any, text: str) -> bool:
    from ..targets.inputs import LiteralSpec

    return isinstance(spec, LiteralSpec) and text.startswith("<")


def reproduce_command(target: Target, specs: Sequence[InputSpec], config: CheckConfig,
                      seed: int, origin: str | None = None) -> str:
    """The one-line command that re-runs this case exactly (given values: from a .pt file)."""
    if (not origin and has_given_values(specs) and not os.environ.get(SAVE_INPUTS_ENV)
            and (caller := values_caller())):
        return caller  # the values live in the caller: rerun it, not a file that is not there
    # (where the drop-in saves each failing call's inputs, the file it names replays them)
    parts = ["gradtool", "check", shell_quote(target.name)]
    if origin or has_given_values(specs):
        # Given values cannot be written as --input: they are replayed from a saved file.
        parts += ["--inputs-from", shell_quote(origin or "INPUTS.pt")]
    elif specs:
        parts.append(pin_flags(specs, config))
    parts += ["--seed", str(seed)]
    parts += _init_flags(target)
    parts += setting_flags(config)
    if tuple(config.checks) != DEFAULT_CHECKS:  # a subset, or an opt-in check (compiled)
        parts += [f"--check {name}" for name in config.checks]
    if config.trust_callables:
        parts.append("--trust-callables")
    if config.masked:
        parts.append("--masked")
    return " ".join(parts)


def values_caller() -> str | None:
    """What reruns a check whose inputs were given as values from Python: the pytest test
    that gave them (PYTEST_CURRENT_TEST), or the script that is running; None in a session
    with no file (a notebook, python -c), where only a saved file can replay them."""
    import os
    import sys
    from pathlib import Path

    from ..targets.load import display_path

    node = os.environ.get("PYTEST_CURRENT_TEST", "").rpartition(" (")[0]
    if node:
        return f"pytest {shell_quote(node)}"
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main or not main.endswith(".py") or not Path(main).is_file():
        return None
    own, parents = Path(__file__).resolve().parents[1], Path(main).resolve().parents
    if own in parents or any(p.name in ("site-packages", "dist-packages") for p in parents):
        return None  # gradtool's own __main__, or a tool's (python -m pytest)
    return f"python {shell_quote(display_path(main))}"


# How values given from Python are replayed; the drop-in adds its own way to this sentence.
REPLAY_VALUES = "torch.save((args, kwargs), 'INPUTS.pt') and pass --inputs-from INPUTS.pt"

# The drop-in saves a failing call's inputs to this folder (dropin/saved.py), so its reproducer
# replays that file rather than the caller.
SAVE_INPUTS_ENV = "GRADTOOL_SAVE_INPUTS"

SETTING_FLAGS = ("dtype", "device", "eps", "atol", "rtol", "nondet_tol", "mode", "probes",
                 "max_memory", "autocast", "reference")


def setting_flags(config: CheckConfig, skip: Sequence[str] = ()) -> list[str]:
    """['--dtype', 'float32', ...]: each setting that differs from the default (those in skip
    left out: a spec sets them itself)."""
    defaults, parts = CheckConfig(), []
    for name in SETTING_FLAGS:
        value = getattr(config, name)
        if name not in skip and value is not None and value != getattr(defaults, name):
            parts += [f"--{name.replace('_', '-')}", shell_quote(str(value))]
    return parts


def _init_flags(target: Target) -> list[str]:
    """--init NAME=VALUE for a module class built with constructor arguments."""
    init = target.init
    if not isinstance(init, dict):
        return []
    return [f"--init {shell_quote(f'{name}={value!r}')}" for name, value in init.items()]


def _cli_input(spec: Any, config: CheckConfig) -> str:
    from ..targets.inputs import LiteralSpec
    from ..targets.values import Keyword, Nested, ValueSpec

    if isinstance(spec, Keyword):
        return f"{spec.name}={_cli_input(spec.spec, config)}"
    if isinstance(spec, Nested):
        return _cli_input(spec.spec, config)
    if isinstance(spec, dict):
        return "{" + ", ".join(f"{k!r}: {_cli_input(v, config)}" for k, v in spec.items()) + "}"
    if isinstance(spec, (tuple, list)):
        items = [_cli_input(v, config) for v in spec]
        if isinstance(spec, list):
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(spec, (LiteralSpec, ValueSpec)):
        text = repr(spec.value)
        return text if not text.startswith("(") else "=" + text
    return spec.describe(config.dtype).replace(f":{config.dtype}", "", 1) \
        if spec.dtype is None else spec.describe(config.dtype)


def left_unchecked(specs: Sequence[Any], names: Sequence[str]) -> str | None:
    """A note naming the given floating tensors not checked because another given tensor
    requires grad (gradcheck's rule, easy to trip on by forgetting requires_grad), or None.
    `names`: the case's input names, in the order of the specs' leaves."""
    from ..targets.values import ValueSpec, leaves

    given = [leaf for _, leaf in leaves([getattr(s, "spec", s) for s in specs])]
    tensors = [(name, leaf) for name, leaf in zip(names, given) if isinstance(leaf, ValueSpec)
               and hasattr(leaf.value, "is_floating_point")]
    if not any(leaf.requires_grad for _, leaf in tensors):
        return None
    left = [name for name, leaf in tensors if not leaf.requires_grad
            and (leaf.value.is_floating_point() or leaf.value.is_complex())]
    if not left:
        return None
    they = "it does" if len(left) == 1 else "they do"
    return (f"{', '.join(repr(n) for n in left)} not checked: {they} not require grad while "
            "another given tensor does (gradcheck's rule); to check it, pass it with "
            "requires_grad=True")


def has_given_values(specs: Sequence[Any]) -> bool:
    """Whether any input is a value the user gave (no --input string can reproduce it)."""
    from ..targets.values import ValueSpec, leaves

    return any(isinstance(leaf, ValueSpec) for _, leaf in leaves(
        [getattr(s, "spec", s) for s in specs]))


def shell_quote(text: str) -> str:
    """Shell-quote readably: bare when safe, else single quotes, else double quotes."""
    import shlex

    if shlex.quote(text) == text:
        return text
    if "'" not in text:
        return f"'{text}'"
    if not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)
