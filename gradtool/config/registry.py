"""The check registry: each check's name, one-line description, default and the module running it."""

# Plain data, no torch: option parsing, specs, pyproject and `gradtool list` read the names before
# any check is imported. A check is one module in gradtool/checks/ defining
#   applies(case, context) -> str | None   (None: it applies; a string: why it is skipped)
#   run(case, context) -> CheckResult
# and one line here. The runner imports the module only when the check runs.

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One rule a check enforces: a stable id (`check.rule`), its severity, what it means.

    A warning is legal but worth telling (the check stays passed; --strict fails on it); a
    failure fails the check. Any rule can be silenced by id (`ignore:` in a spec or
    [tool.gradtool])."""

    id: str
    severity: str   # "failure" or "warning" (results.Severity's values)
    description: str


@dataclass(frozen=True)
class CheckInfo:
    """One registered check."""

    name: str
    description: str
    default: bool = True   # in the default run (where it applies); False: only when asked for
    module: str = ""       # gradtool.checks.<module>; the name when empty
    rules: tuple[Rule, ...] = ()  # the rules its findings name (stable ids)
    variants: tuple[tuple[str, str], ...] = ()  # (when, module): run instead where `when` holds
    hooks: tuple[tuple[str, str], ...] = ()     # (when, module:function) applied to the result
    probe_graph: bool = False  # reads the probe phase's graph forward (kept for it)

    @property
    def import_path(self) -> str:
        return f"gradtool.checks.{self.module or self.name}"


def _rules(severity: str, *pairs: tuple[str, str]) -> tuple[Rule, ...]:
    return tuple(Rule(f"contract.{name}", severity, text) for name, text in pairs)


def _op_rules(check: str, *pairs: tuple[str, str]) -> tuple[Rule, ...]:
    return tuple(Rule(f"{check}.{name}", "failure", text) for name, text in pairs)


CONTRACT_RULES = _rules(
    "failure",
    ("forward_not_tensor", "forward returns no tensor"),
    ("unmarked_inplace", "forward writes an input without ctx.mark_dirty"),
    ("forward_nonfinite", "forward returns NaN/Inf on finite inputs"),
    ("no_differentiable_output", "no output requires grad"),
    ("gradient_count", "backward returns a number of gradients other than forward's inputs"),
    ("gradient_for_non_tensor", "backward returns a gradient for a non-tensor input"),
    ("gradient_type", "backward returns something other than a tensor or None"),
    ("gradient_shape", "a gradient's shape neither equals nor broadcasts to its input's"),
    ("gradient_dtype", "a gradient's dtype differs from its input's (the engine casts it, "
                       "losing precision silently)"),
    ("gradient_device", "a gradient is on another device than its input"),
    ("grad_output_modified", "backward writes to grad_output in place"),
    ("constant_term", "backward gives a nonzero gradient for a zero grad_output"),
    ("unused_output_raises", "backward raises when an output's gradient is None"),
    ("unused_output_differs", "a None output gradient acts otherwise than a zero one"),
    ("ignored_output", "backward ignores a differentiable output's gradient"),
    ("gradient_nonfinite", "backward returns NaN/Inf on finite inputs"),
    ("nonlinear", "backward is not linear in grad_output"),
    ("nondeterministic", "two backward calls differ by more than nondet_tol"),
) + _rules(
    "warning",
    ("inner_unchecked", "gradtool could not re-run a custom Function inside a model alone"),
    ("inner_raised", "a custom Function inside a model raised when gradtool re-ran it alone "
                     "(the model's own run did not)"),
    ("broadcast_gradient", "a gradient broadcastable to its input: the engine sums it (legal)"),
)

REGISTRY: tuple[CheckInfo, ...] = (
    CheckInfo("contract", "forward and backward keep autograd's rules (arity, shapes, dtypes, "
                          "linearity, purity, determinism)", rules=CONTRACT_RULES,
              hooks=(("composite", "gradtool.run.inner:with_inner_contracts"),
                     ("has_ops", "gradtool.run.ops_inside:with_op_contracts")),
              probe_graph=True),
    CheckInfo("gradient", "backward's Jacobian against finite differences, element by element",
              variants=(("low_precision", "precision"),), probe_graph=True),
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
                           "write to an input, no output aliasing an input)",
              rules=_op_rules("op_schema",
                              ("undeclared_mutation", "the kernel writes an argument its schema "
                               "does not declare mutable"),
                              ("aliasing_output", "an output aliases an input the schema says "
                               "is new"))),
    CheckInfo("op_fake", "custom ops: the fake kernel exists and agrees with the real one on "
                         "shape, dtype, strides and device, also with symbolic sizes",
              rules=_op_rules("op_fake",
                              ("missing", "no fake (meta) kernel is registered"),
                              ("outputs", "the fake kernel returns another number of outputs"),
                              ("shape", "the fake kernel's output shape differs from the real"),
                              ("dtype", "the fake kernel's output dtype differs from the real"),
                              ("device", "the fake kernel's output device differs"),
                              ("strides", "the fake kernel's output strides differ"),
                              ("raises", "the fake kernel raises"),
                              ("symbolic_raises", "the fake kernel raises with symbolic sizes"),
                              ("dynamic_shape", "the fake kernel's shape is wrong with symbolic "
                               "sizes"))),
    CheckInfo("op_autograd", "custom ops: an autograd formula is registered (at an Autograd "
                             "key) when an input is differentiable",
              rules=_op_rules("op_autograd",
                              ("missing", "no autograd formula for a differentiable input"),
                              ("wrong_key", "the formula is registered at a key autograd "
                               "does not reach"))),
    CheckInfo("op_compiled", "custom ops: outputs and gradients under torch.compile's tracing "
                             "with dynamic sizes equal eager's (opcheck's aot test; opt-in)",
              default=False,
              rules=_op_rules("op_compiled",
                              ("outputs", "outputs under torch.compile differ from eager's"),
                              ("gradients", "gradients under torch.compile differ from eager's"),
                              ("fails", "the op fails under torch.compile's tracing"))),
    CheckInfo("layout", "gradients with transposed, sliced, expanded (stride-0) and "
                        "channels_last grad_outputs and inputs equal the contiguous ones",
              rules=(Rule("layout.grad_output_strides", "failure", "backward ignores "
                          "grad_output's strides: wrong for a non-contiguous grad_output"),
                     Rule("layout.grad_output_raises", "failure", "backward raises on a "
                          "non-contiguous grad_output"),
                     Rule("layout.input_strides", "failure", "backward is wrong for a "
                          "non-contiguous input"),
                     Rule("layout.input_raises", "failure", "forward or backward raises on a "
                          "non-contiguous input (view instead of reshape)"),
                     Rule("layout.input_values", "warning", "forward's values change with its "
                          "input's layout (storage-addressing code may mean it)"))),
)

BY_NAME = {info.name: info for info in REGISTRY}
CHECK_NAMES = tuple(BY_NAME)
DEFAULT_CHECKS = tuple(info.name for info in REGISTRY if info.default)
RULES = {rule.id: rule for info in REGISTRY for rule in info.rules}
RULE_IDS = tuple(RULES)
