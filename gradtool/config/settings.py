"""CheckConfig: the frozen settings of one run, and the per-dtype default tolerances."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import ConfigError, did_you_mean
from .registry import BY_NAME, CHECK_NAMES, DEFAULT_CHECKS, RULES  # noqa: F401 - CHECK_NAMES: cli

MODES = ("auto", "full", "probe")

# torch.autograd.gradcheck's defaults for float64 (used as given when the user sets atol or rtol,
# and for checks other than `gradient`; a float64 gradient check with neither set uses the
# measured tolerance of numerics/measured.py instead); looser rows for the low-precision dtypes,
# whose finite differences cannot resolve anything finer. (Complex inputs need Wirtinger
# derivatives, which the finite differences here do not compute: not offered.)
DEFAULT_TOLERANCES: dict[str, dict[str, float]] = {
    "float64": {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3},
    "float32": {"eps": 1e-3, "atol": 1e-3, "rtol": 1e-2},
    "float16": {"eps": 1e-2, "atol": 1e-2, "rtol": 5e-2},
    "bfloat16": {"eps": 1e-2, "atol": 5e-2, "rtol": 1e-1},
}

DTYPES = tuple(DEFAULT_TOLERANCES)


@dataclass(frozen=True)
class CheckConfig:
    """Everything that decides a verdict; recorded in every report so a run can be repeated."""

    seed: int = 0
    dtype: str = "float64"
    device: str = "cpu"
    eps: float | None = None
    atol: float | None = None
    rtol: float | None = None
    nondet_tol: float = 0.0
    masked: bool = False  # sparse inputs: compare specified elements only (gradcheck's masked)
    module_parameters: bool = True  # a module's parameters are checked too (False: only the
                                    # tensors given, gradcheck's scope: the drop-in's)
    forward_any: bool = False  # forward_ad on any target, not only a Function's own jvp
                               # (gradcheck's check_forward_ad: the drop-in's)
    checks: tuple[str, ...] = DEFAULT_CHECKS
    mode: str = "auto"
    probes: int = 4
    full_budget_s: float = 1.0
    max_memory: float = 2e9
    strict: bool = False
    resample: int = 0
    # After a failure is confirmed, gather every piece of evidence anyway (no cost plan cuts).
    exhaustive: bool = False
    trust_callables: bool = False  # specs may run plain callables they declare trusted
    max_worst: int = 5
    reference: str | None = None     # module:fn, the float64 reference of a low-precision run
    autocast: str | None = None      # run forward in a torch.autocast region of this dtype
    timeout: float = 600.0  # seconds per target in a worker process (0: no limit)
    ignore: tuple[str, ...] = ()  # rule ids silenced (a spec's or [tool.gradtool]'s ignore:)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in DEFAULT_TOLERANCES:
            hint = did_you_mean(self.dtype, DTYPES)
            raise ConfigError(f"dtype {self.dtype!r} is not supported; choose one of "
                              f"{', '.join(DTYPES)}", hint)
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        for name in self.checks:
            if name not in BY_NAME:  # read now: a check registered later counts
                raise ConfigError(f"unknown check {name!r}; checks are {', '.join(BY_NAME)}",
                                  did_you_mean(name, tuple(BY_NAME)))
        for name in ("eps", "atol", "rtol", "nondet_tol"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigError(f"{name} must be a non-negative number, got {value!r}")
        if self.eps is not None and self.eps == 0:
            raise ConfigError("eps must be positive, got 0")
        if self.autocast is not None and self.autocast not in ("float16", "bfloat16"):
            raise ConfigError(f"autocast {self.autocast!r} is not float16 or bfloat16",
                              did_you_mean(self.autocast, ("float16", "bfloat16")))
        for rule in self.ignore:
            if rule not in RULES:
                # Over a hundred ids: the suggestion and the listing command, not all of them.
                raise ConfigError(f"unknown rule id {rule!r} to ignore; rule ids are check.rule "
                                  "(gradtool list --rules shows them)",
                                  did_you_mean(rule, tuple(RULES)))
            if RULES[rule].unsilenceable:
                raise ConfigError(f"rule {rule!r} cannot be ignored: {RULES[rule].unsilenceable}")
        if self.probes < 1:
            raise ConfigError(f"probes must be at least 1, got {self.probes}")

    @property
    def gradcheck_cost(self) -> bool:
        """A failure's evidence paid as torch's failing gradcheck pays it (the drop-in's:
        gradcheck's scope, not exhaustive): the first confirmed failure, no culprit search
        beyond a cheap one; the rest offered with exhaustive=True / --exhaustive."""
        return not self.module_parameters and not self.exhaustive

    @property
    def measured(self) -> bool:
        """Whether gradient verdicts use the measured finite-difference tolerance: float64, and
        no atol/rtol set by the user (a flag, a spec, [tool.gradtool]); either one set keeps
        gradcheck's exact meaning |a - n| <= atol + rtol |n|."""
        return self.dtype == "float64" and self.atol is None and self.rtol is None

    def fixed(self) -> CheckConfig:
        """A copy judged by the dtype's fixed tolerances (gradcheck's), never measured."""
        return replace(self, atol=self.tolerance("atol"), rtol=self.tolerance("rtol"))

    def tolerance(self, name: str) -> float:
        """The effective eps/atol/rtol: the user's value, else the dtype's default."""
        value = getattr(self, name)
        return DEFAULT_TOLERANCES[self.dtype][name] if value is None else value

    @property
    def effective(self) -> dict[str, Any]:
        """Plain dict of the settings as applied (tolerances resolved), for reports."""
        # Shallow (asdict deep-copies every field: a third of a millisecond per tiny check)
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        for name in ("eps", "atol", "rtol"):
            data[name] = self.tolerance(name)
        data["checks"] = list(self.checks)
        data["ignore"] = list(self.ignore)
        return data

    def with_(self, **changes: Any) -> CheckConfig:
        """A copy with some fields changed (None values are ignored); itself when none is (it is
        frozen: every check of a run asks, most with no change)."""
        changed = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **changed) if changed else self
