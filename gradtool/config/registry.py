"""The check registry: each check's name, one-line description, default and the module running it."""

# Plain data, no torch: option parsing, specs, pyproject and `gradtool list` read the names before
# any check is imported. A check is one module in gradtool/checks/ defining
#   applies(case, context) -> str | None   (None: it applies; a string: why it is skipped)
#   run(case, context) -> CheckResult
# and one line here. The runner imports the module only when the check runs.

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

TARGET_KINDS = ("function", "module", "callable", "op")  # targets/kinds.py's adapters


@dataclass(frozen=True)
class Rule:
    """One rule a check enforces: a stable id (`check.rule`), its severity, what it means.

    A warning is legal but worth telling (the check stays passed; --strict fails on it); a
    failure fails the check. A rule can be silenced by id (`ignore:` in a spec or
    [tool.gradtool]) unless `unsilenceable` says why not (a wrong gradient value). A
    diagnosis rule names the kind of mistake behind a mismatch (a factor, a transpose): it
    comes with the check's mismatch finding, never alone. targets and needs_backward are the
    check's unless the rule says otherwise."""

    id: str
    severity: str   # "failure" or "warning" (results.Severity's values)
    description: str
    targets: tuple[str, ...] = TARGET_KINDS  # the target kinds it can be found on
    needs_backward: bool = True              # found only where a backward exists
    unsilenceable: str = ""                  # why ignore: refuses it (empty: it may be ignored)
    diagnosis: bool = False                  # names the mistake behind a mismatch
    # About backward's algebra alone (linear in grad_output, zero in -> zero out), not about
    # data: broken by a Function inside a model or callable whose own gradient check passed in
    # the same run, it is a warning naming the Function (the user's gradient is right).
    algebra: bool = False

    @property
    def check(self) -> str:
        return self.id.split(".", 1)[0]


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
    targets: tuple[str, ...] = TARGET_KINDS  # the target kinds it can apply to
    needs_backward: bool = True  # skipped where there is no backward (an op without autograd)
    reuses_graph: bool = False  # derives from the first-order check's graph forward (kept for it)
    # The cost model (run/runner.py:for_cost): skipped on an expensive forward once this check
    # failed in the same run (it waits for that fix; asked for by name, it runs)
    waits_for: str | None = None
    # reads the contract's graph (and its backward) from the case's ledger (numerics/ledger.py):
    # the contract records them only when a check that reads them runs
    reads_recorded: bool = False
    # its linearity test reads this check's one-hot rows when this one runs right after it
    # (checks/linear_rows.py): left pending until then
    rows_from: str | None = None
    # records its graph (and backward through it) in the case's ledger for the checks that
    # read it (`reads_recorded`): the cost plan (run/plan.py) runs it before them
    records: bool = False

    @property
    def import_path(self) -> str:
        """gradtool.checks.<module> (the name when empty); a dotted module is taken whole (a
        check living outside gradtool, registered with register())."""
        module = self.module or self.name
        return module if "." in module else f"gradtool.checks.{module}"


# The kinds of mistake diagnosis/classify.py names in a first-order Jacobian block (and in a
# probe's values); tests/test_registry.py holds classify's FIRST_ORDER_KINDS to it.
FIRST_ORDER_KINDS = (
    ("nonfinite", "the numerical or analytical Jacobian is NaN/Inf (forward outside its domain, "
                  "or backward divides by zero)"),
    ("swapped", "the gradient of one input is another input's: gradients swapped"),
    ("zero", "the gradient is zero (backward returns zero or None) where it should not be"),
    ("factor", "the gradient is a constant multiple of the right one (a missing or extra factor)"),
    ("sign", "the gradient has the wrong sign"),
    ("transposed", "the gradient (or grad_output) is used with its indices transposed"),
    ("shifted", "the gradient is shifted or rolled along an axis"),
    ("ignores_grad_output", "backward ignores grad_output (or uses only its sum)"),
    ("constant_term", "backward adds a term that does not depend on grad_output"),
    ("broadcast_not_reduced", "backward uses only part of grad_output: a broadcast not summed"),
    ("straight_through", "backward passes grad_output through (an identity, or one clipped to a "
                         "range) where forward is a step: a surrogate to declare in a spec"),
    ("branch", "the gradient is wrong only on one side of an input's sign (a branch)"),
    ("exchanged", "the gradients of some input elements are one another's (an index mix-up)"),
    ("few_elements", "a few elements are wrong, the rest agree"),
    ("part_factor", "the wrong elements are all one constant multiple of the right ones, the "
                    "rest agree (a factor on part of the gradient: one input row, one branch)"),
    ("diagonal_only", "an elementwise formula for an op that is not elementwise"),
    ("no_pattern", "elements differ with no simple pattern"),
)
SECOND_ORDER_KINDS = (
    ("nonfinite", "the second derivative is NaN/Inf (backward not differentiable there)"),
    ("untracked", "the second derivative is zero: backward uses untracked tensors or no_grad"),
    ("few_elements", "a few elements of the second derivative are wrong, the rest agree"),
    ("factor", "the second derivative is a constant multiple of the right one"),
    ("sign", "the second derivative has the wrong sign"),
    ("no_pattern", "elements of the second derivative differ with no simple pattern"),
)
OP = ("op",)
# A wrong value is never silenced, whichever check computed it: ignore: is for rules a user may
# knowingly break (an engine-summed gradient), a diagnosis kind, or a contract detail.
NEVER_SILENCED = "a wrong gradient value is never silenced (fix backward, or declare xfail:)"


def _forward_mode(kinds: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The kinds of mistake as forward mode makes them: jvp and its tangent for backward and
    its grad_output."""
    return tuple((kind, text.replace("backward", "jvp").replace("grad_output", "the tangent"))
                 for kind, text in kinds)


def _jacobian_rules(check: str, what: str, kinds: tuple[tuple[str, str], ...], *extra: Rule,
                    targets: tuple[str, ...] = TARGET_KINDS, unsilenceable: str = ""
                    ) -> tuple[Rule, ...]:
    """A Jacobian check's rules: its mismatch, then one diagnosis rule per kind of mistake."""
    mismatch = Rule(f"{check}.mismatch", "failure", f"{what} disagrees beyond tolerance",
                    targets=targets, unsilenceable=unsilenceable)
    kinds_ = tuple(Rule(f"{check}.{kind}", "failure", text, targets=targets, diagnosis=True)
                   for kind, text in kinds)
    return (mismatch, *(replace(r, targets=targets) for r in extra), *kinds_)




# The contract's rules about backward's algebra alone (see Rule.algebra).
ALGEBRA = ("contract.constant_term", "contract.nonlinear")


def _rules(severity: str, *pairs: tuple[str, str]) -> tuple[Rule, ...]:
    return tuple(Rule(f"contract.{name}", severity, text, algebra=f"contract.{name}" in ALGEBRA)
                 for name, text in pairs)


def _op_rules(check: str, *pairs: tuple[str, str]) -> tuple[Rule, ...]:
    return tuple(Rule(f"{check}.{name}", "failure", text, targets=OP, needs_backward=False)
                 for name, text in pairs)


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
    ("constant_term", "backward gives a nonzero gradient for a zero grad_output (a warning for "
                      "a Function inside a model whose gradient check passed)"),
    ("unused_output_raises", "backward raises when an output's gradient is None"),
    ("unused_output_differs", "a None output gradient acts otherwise than a zero one"),
    ("ignored_output", "backward ignores a differentiable output's gradient"),
    ("gradient_nonfinite", "backward returns NaN/Inf on finite inputs"),
    ("nonlinear", "backward is not linear in grad_output (below float64: beyond what rounding "
                  "allows; a warning for a Function inside a model whose gradient check "
                  "passed)"),
    ("nondeterministic", "two backward calls differ by more than nondet_tol (below float64: "
                         "by more than rounding allows)"),
    ("backward_writes_input", "backward writes to an input forward saved (the caller's memory)"),
) + _rules(
    "warning",
    ("inner_unchecked", "gradtool could not re-run a custom Function inside a model alone"),
    ("inner_raised", "a custom Function inside a model raised when gradtool re-ran it alone "
                     "(the model's own run did not)"),
    ("rerun_differs", "a custom Function inside a model broke a rule only when gradtool re-ran "
                      "it alone, while the model's own run showed it kept (autograd's engine "
                      "accepted its gradients)"),
    ("broadcast_gradient", "a gradient broadcastable to its input: the engine sums it (legal)"),
    ("gradient_aliases_input", "a gradient shares memory with an input: the engine may "
                               "accumulate into it in place"),
)

REGISTRY: tuple[CheckInfo, ...] = (
    CheckInfo("contract", "forward and backward keep autograd's rules (arity, shapes, dtypes, "
                          "linearity, purity, determinism)", rules=CONTRACT_RULES,
              hooks=(("composite", "gradtool.run.inner:with_inner_contracts"),
                     ("has_ops", "gradtool.run.ops_inside:with_op_contracts")),
              probe_graph=True, rows_from="gradient", records=True),
    CheckInfo("gradient", "backward's Jacobian against finite differences, element by element",
              variants=(("low_precision", "precision"),), probe_graph=True,
              reads_recorded=True,
              rules=_jacobian_rules(
                  "gradient", "backward's Jacobian against finite differences (or a declared "
                  "surrogate, or the float64 reference below float64)", FIRST_ORDER_KINDS,
                  Rule("gradient.forward_nonfinite", "failure", "forward returns NaN/Inf on the "
                       "inputs, so no gradient can be compared"),
                  Rule("gradient.forward_drift", "failure", "forward returns different "
                       "values on the same inputs with torch's RNG frozen (uninitialised "
                       "memory, a counter), by more than a summation order's rounding "
                       "(atomics, index_add_) and than finite differences resolve (2 eps "
                       "(atol + rtol |J|)): which outputs, by how much; no gradient can be "
                       "compared. A smaller drift is checked as deterministic, with a note"),
                  Rule("gradient.forward_precision", "failure", "forward computes coarser "
                       "than the dtype it is given (float64 in, float32 inside: every output a "
                       "float32 number); its gradient is then judged at that precision"),
                  Rule("gradient.rounding", "failure", "below float64: the gradient is further "
                       "from the float64 reference than rounding explains", unsilenceable=NEVER_SILENCED),
                  Rule("gradient.taylor", "failure", "the Taylor remainder does not shrink as "
                       "h² (the verdict where no float64 run is possible)", unsilenceable=NEVER_SILENCED),
                  unsilenceable=NEVER_SILENCED)),
    CheckInfo("double_backward", "the gradient check applied to backward itself "
                                 "(what gradgradcheck does)",
              rules=_jacobian_rules("double_backward", "the Jacobian of backward against "
                                    "finite differences", SECOND_ORDER_KINDS,
                                    Rule("double_backward.unsupported", "warning", "backward "
                                         "runs, but raises when differentiated (under "
                                         "create_graph): double backward unsupported, not "
                                         "declared with @once_differentiable"),
                                    unsilenceable=NEVER_SILENCED),
              variants=(("low_precision", "second_precision"),),
              hooks=(("composite", "gradtool.run.second:annotate_double"),),
              reuses_graph=True),
    CheckInfo("forward_ad", "forward mode: jvp's columns J·u against finite differences, and "
                            "forward against reverse mode (on when the Function defines jvp; "
                            "any target under gradcheck's check_forward_ad)",
              rules=_jacobian_rules(
                  "forward_ad", "jvp's Jacobian against finite differences",
                  _forward_mode(FIRST_ORDER_KINDS),
                  Rule("forward_ad.reverse_disagrees", "failure", "jvp agrees with finite "
                       "differences but backward does not agree with jvp: backward is wrong",
                       unsilenceable=NEVER_SILENCED),
                  unsilenceable=NEVER_SILENCED)),
    CheckInfo("vmap", "batched forward and backward under torch.func.vmap equal the per-sample "
                      "loop (on for generate_vmap_rule or a vmap staticmethod)",
              targets=("function",),
              rules=tuple(Rule(f"vmap.{name}", "failure", text, targets=("function",),
                               unsilenceable=NEVER_SILENCED) for
                          name, text in (
                  ("forward", "vmap(forward) differs from the per-sample loop"),
                  ("backward", "vmap of the VJP differs from the per-sample loop"),
                  ("grads_batched", "backward with batched grad_outputs (is_grads_batched) "
                                    "differs from the per-sample loop")))),
    CheckInfo("complex", "complex inputs or outputs: real and imaginary parts against finite "
                         "differences in PyTorch's convention (conjugate Wirtinger)",
              rules=_jacobian_rules(
                  "complex", "the real map's Jacobian against finite differences",
                  (("conj", "backward returns the conjugate of PyTorch's gradient (a missing "
                            ".conj(), or one too many on its result)"), *FIRST_ORDER_KINDS),
                  Rule("complex.forward_drift", "failure", "forward returns different values "
                       "on the same inputs with torch's RNG frozen, beyond what finite "
                       "differences resolve (as gradient.forward_drift, real and imaginary parts "
                       "apart)"),
                  unsilenceable=NEVER_SILENCED),
              variants=(("low_precision", "complex_precision"),)),
    CheckInfo("compiled", "first- and second-order gradients under torch.compile equal eager's "
                          "(opt-in)", default=False,
              rules=(Rule("compiled.first_order", "failure", "first-order gradients under "
                          "torch.compile differ from eager's", unsilenceable=NEVER_SILENCED),
                     Rule("compiled.second_order", "failure", "second-order gradients under "
                          "torch.compile differ from eager's", unsilenceable=NEVER_SILENCED))),
    CheckInfo("op_schema", "custom ops: the schema says what the kernel does (no undeclared "
                           "write to an input, no output aliasing an input)",
              targets=OP, needs_backward=False, rules=_op_rules("op_schema",
                              ("undeclared_mutation", "the kernel writes an argument its schema "
                               "does not declare mutable"),
                              ("aliasing_output", "an output aliases an input the schema says "
                               "is new"))),
    CheckInfo("op_fake", "custom ops: the fake kernel exists and agrees with the real one on "
                         "shape, dtype, strides and device, also with symbolic sizes",
              targets=OP, needs_backward=False, rules=_op_rules("op_fake",
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
              targets=OP, needs_backward=False, rules=_op_rules("op_autograd",
                              ("missing", "no autograd formula for a differentiable input"),
                              ("wrong_key", "the formula is registered at a key autograd "
                               "does not reach"))),
    CheckInfo("op_compiled", "custom ops: outputs and gradients under torch.compile's tracing "
                             "with dynamic sizes equal eager's (opcheck's aot test; opt-in)",
              default=False,
              targets=OP, needs_backward=False, rules=_op_rules("op_compiled",
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
                          "input's layout (storage-addressing code may mean it)")),
              waits_for="gradient", reads_recorded=True),
)

BY_NAME = {info.name: info for info in REGISTRY}
CHECK_NAMES = tuple(BY_NAME)
DEFAULT_CHECKS = tuple(info.name for info in REGISTRY if info.default)
RULES = {rule.id: rule for info in REGISTRY for rule in info.rules}
RULE_IDS = tuple(RULES)
# The checks the gradcheck drop-in runs for torch's keywords: check_backward_ad (the Jacobian;
# its complex form too where a value is complex), check_forward_ad (forward mode on any target).
GRADCHECK_BACKWARD = ("gradient",)
GRADCHECK_COMPLEX = ("complex",)
GRADCHECK_FORWARD = ("forward_ad",)


@dataclass(frozen=True)
class ReportFormat:
    """One report file format: its name, the check command's option and the [tool.gradtool]
    key that ask for it, and the function rendering a Report to text ("module:function",
    imported only when the format is written; called as render(report, **links))."""

    name: str
    option: str
    pyproject_key: str
    render: str
    description: str

    def renderer(self) -> Callable[..., str]:
        """The rendering function (its module imported now, not before)."""
        from importlib import import_module

        module, function = self.render.split(":")
        return getattr(import_module(module), function)


FORMATS: dict[str, ReportFormat] = {f.name: f for f in (
    ReportFormat("json", "--json", "", "gradtool.render.json:render_json",
                 "the whole report as JSON (schemas/report.schema.json)"),
    ReportFormat("junit", "--junit-xml", "junit_xml", "gradtool.render.junit:render_junit",
                 "JUnit XML, one testcase per (target, case, check)"),
    ReportFormat("html", "--html", "html", "gradtool.render.html:render_html",
                 "one self-contained HTML page with heat maps of failing blocks"),
)}


def register(item: CheckInfo | ReportFormat) -> None:
    """Add a check (with its rules) or a report format to the registry: its one entry. Option
    parsing, specs, --check, ignore: and the runner read BY_NAME, RULES and FORMATS when they
    run, so the entry is all a new one needs (the tuples above are the built-in ones)."""
    if isinstance(item, ReportFormat):
        FORMATS[item.name] = item
        return
    BY_NAME[item.name] = item
    RULES.update({rule.id: rule for rule in item.rules})
