"""The check registry: each check's name, one-line description, default and the module running it."""

# Plain data, no torch: option parsing, specs, pyproject and `gradtool list` read the names before
# any check is imported. A check is one module in gradtool/checks/ defining
#   applies(case, context) -> str | None   (None: it applies; a string: why it is skipped)
#   run(case, context) -> CheckResult
# and one line here. The runner imports the module only when the check runs.

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckInfo:
    """One registered check."""

    name: str
    description: str
    default: bool = True   # in the default run (where it applies); False: only when asked for
    module: str = ""       # gradtool.checks.<module>; the name when empty

    @property
    def import_path(self) -> str:
        return f"gradtool.checks.{self.module or self.name}"


REGISTRY: tuple[CheckInfo, ...] = (
    CheckInfo("contract", "forward and backward keep autograd's rules (arity, shapes, dtypes, "
                          "linearity, purity, determinism)"),
    CheckInfo("gradient", "backward's Jacobian against finite differences, element by element"),
    CheckInfo("double_backward", "the gradient check applied to backward itself "
                                 "(what gradgradcheck does)"),
    CheckInfo("forward_ad", "forward mode: jvp's columns J·u against finite differences, and "
                            "forward against reverse mode (on when the Function defines jvp)"),
    CheckInfo("vmap", "batched forward and backward under torch.func.vmap equal the per-sample "
                      "loop (on for generate_vmap_rule or a vmap staticmethod)"),
    CheckInfo("complex", "complex inputs or outputs: real and imaginary parts against finite "
                         "differences in PyTorch's convention (conjugate Wirtinger)"),
    CheckInfo("compiled", "first- and second-order gradients under torch.compile equal eager's "
                          "(opt-in)", default=False),
    CheckInfo("op_schema", "custom ops: the schema says what the kernel does (no undeclared "
                           "write to an input, no output aliasing an input)"),
    CheckInfo("op_fake", "custom ops: the fake kernel exists and agrees with the real one on "
                         "shape, dtype, strides and device, also with symbolic sizes"),
    CheckInfo("op_autograd", "custom ops: an autograd formula is registered (at an Autograd "
                             "key) when an input is differentiable"),
    CheckInfo("op_compiled", "custom ops: outputs and gradients under torch.compile's tracing "
                             "with dynamic sizes equal eager's (opcheck's aot test; opt-in)",
              default=False),
)

BY_NAME = {info.name: info for info in REGISTRY}
CHECK_NAMES = tuple(BY_NAME)
DEFAULT_CHECKS = tuple(info.name for info in REGISTRY if info.default)
