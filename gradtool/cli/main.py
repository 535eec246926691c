"""Command line: click commands; the one place where exceptions become exit codes."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..config import registry
from ..config.settings import CHECK_NAMES, DTYPES, MODES
from ..errors import ExitCode, GradtoolError, NothingToCheck
from ..targets.inputs import INPUT_HELP
from .options import file_param

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from .._version import __version__

    def pkg(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return (f"gradtool {__version__} (torch {pkg('torch')}, numpy {pkg('numpy')}, "
            f"Python {sys.version.split()[0]})")


def _print_version(ctx: click.Context, _: Any, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version_text())
        ctx.exit(0)


@click.group(context_settings=CONTEXT)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version, help="Show gradtool, torch, numpy and Python versions.")
def main() -> None:
    """gradtool: verify the gradients of custom torch.autograd Functions.

    \b
    Exit codes: 0 all checks passed, 1 a check failed or errored,
    2 usage error (bad option, spec or target), 3 internal error, 5 nothing to check,
    130 interrupted (Ctrl-C or SIGTERM; finished results are still reported).
    """


class Command(click.Command):
    """A command whose "requires an argument" error names what the option takes (a bare
    `--json` said only that, not that it wants a FILE)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list it is given
        try:
            return super().parse_args(ctx, args)
        except click.BadOptionUsage as exc:
            option = next((p for p in self.params if exc.option_name in getattr(p, "opts", ())),
                          None)
            metavar = getattr(option, "metavar", None)
            if metavar and _lacks_value(given, exc.option_name):
                exc.message = (f"Option {exc.option_name!r} requires an argument: {metavar} "
                               f"(e.g. {exc.option_name} report.{metavar_example(option)})")
            raise


def _lacks_value(args: list[str], option: str) -> bool:
    """Whether an option is given last, or right before another option: no value follows."""
    at = [k for k, a in enumerate(args) if a == option]
    return bool(at) and (at[-1] == len(args) - 1 or args[at[-1] + 1].startswith("-"))


def metavar_example(option: Any) -> str:
    """The file extension an example names: a report format's own."""
    return {"--json": "json", "--junit-xml": "xml", "--html": "html"}.get(option.opts[0], "out")


def guarded(fn: Callable[..., ExitCode]) -> Callable[..., None]:
    """Map exceptions to exit codes: user mistakes -> 2 (short message), bugs -> 3."""
    def wrapper(**kwargs: Any) -> None:
        show_tb = kwargs.get("traceback", False)
        try:
            code = fn(**kwargs)
        except NothingToCheck as exc:
            click.echo(f"gradtool: {exc}", err=True)
            code = ExitCode.NOTHING
        except GradtoolError as exc:
            if show_tb:
                traceback.print_exc()
            click.echo(f"gradtool: error: {exc}", err=True)
            code = ExitCode.USAGE
        except click.exceptions.Exit:
            raise
        except BrokenPipeError:  # `gradtool ... | head`: the reader left; stop quietly
            from .output import silence_stdout

            silence_stdout()
            code = ExitCode.OK
        except Exception:
            traceback.print_exc()
            click.echo("gradtool: internal error (a bug in gradtool) — please report it with "
                       "the traceback above", err=True)
            code = ExitCode.INTERNAL
        sys.exit(int(code))

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def check_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by check, graph and list (defaults None: pyproject fills them)."""
    options = [
        click.option("-i", "--input", "inputs", multiple=True, metavar="SPEC",
                     help="One forward argument, in order (repeat). See 'Inputs' below."),
        click.option("--seed", type=int, default=None, help="Seed for sampled inputs [0]."),
        click.option("--dtype", type=click.Choice(DTYPES), default=None,
                     help="Floating dtype of sampled tensors [float64]."),
        click.option("--device", default=None, help="Device of sampled tensors [cpu]."),
        click.option("--inputs-from", metavar="FACTORY",
                     help="Inputs from file.py:name / module:name (a callable taking generator, "
                          "dtype, device) or a .pt file (see --save-inputs)."),
        click.option("--init", "init", multiple=True, metavar="NAME=VALUE",
                     help="Constructor argument of an nn.Module class target, a Python literal "
                          "(repeat)."),
        click.option("--traceback", is_flag=True, help="Show Python tracebacks of usage errors."),
        click.option("--import", "imports", multiple=True, metavar="MODULE|FILE",
                     help="Import this module or .py file first (repeat): it registers the "
                          "custom ops named as ns::name."),
        click.option("--sweep", "sweeps", multiple=True, metavar="NAME=V1,V2|NAME=awkward",
                     help="Values of a size symbol in -i shapes (-i 4xD --sweep D=15,16,17), one "
                          "case each; repeat for the product; awkward: 1, 2, 3, 15, 16, 17, 31, "
                          "33 within a budget of 32 cases."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def isolation_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Worker processes: how many, how long and how much memory each target may take."""
    options = [
        click.option("-n", "--workers", default=None, metavar="N|auto",
                     callback=lambda _c, _p, v: _workers(v),
                     help="Worker processes running targets in parallel (auto: one per core) [1]."),
        click.option("--timeout", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
                     help="Seconds a target may run before its worker is stopped and it is an "
                          "error (0: no limit) [600]."),
        click.option("--max-rss", type=click.IntRange(min=1), default=None, metavar="BYTES",
                     help="Memory (data segment) each worker may allocate; beyond it the "
                          "allocation fails and the target is an error [no limit]."),
        click.option("--isolate/--no-isolate", default=True,
                     help="Run targets in worker processes that may crash or hang without "
                          "losing the others; --no-isolate runs in-process (pdb, profilers)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _report_file(_ctx: Any, param: Any, value: str | None) -> str | None:
    """A report file's name, refused where it reads as a target: a bare `--json` before the
    target took the target as its FILE and left nothing to check (exit 5, the target unnamed)."""
    if value and (value.endswith((".py", ".yaml", ".yml")) or ":" in value):
        option = param.opts[0]
        raise click.BadParameter(
            f"{value!r} reads as a target, not a report file: give the FILE right after the "
            f"option ({option} report.{metavar_example(param)} {value})", param=param)
    return value


def report_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Where and how the report goes: shared by check and trace."""
    options = [
        click.option("--format", "fmt", type=click.Choice(["terminal", "json"]), default=None,
                     help="Report format on stdout [terminal]."),
        *(click.option(form.option, file_param(form.name), type=click.Path(dir_okay=False),
                       default=None, metavar="FILE", callback=_report_file,
                       help=f"Write {form.description} to this file.")
          for form in registry.FORMATS.values()),
        click.option("--annotations", type=click.Choice(["auto", "github", "none"]),
                     default=None,
                     help="GitHub Actions ::error annotations [auto: when GITHUB_ACTIONS=true]."),
        click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto",
                     help="Colour in the terminal report (NO_COLOR is honoured) [auto]."),
        click.option("-q", "--quiet", is_flag=True, help="Print only failures and the summary."),
        click.option("-v", "--verbose", is_flag=True,
                     help="Show per-check timing and call counts."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _warn_misplaced(args: tuple[str, ...]) -> None:
    """gradtool's own options after the script go to the script: say so (the script may take
    the same flag, so it is a note, not an error; `--` before the script's arguments silences
    it)."""
    names = {o for p in click.get_current_context().command.params for o in p.opts}
    mine = [a for a in args if a.split("=", 1)[0] in names]
    if mine:
        click.echo(f"gradtool: note: {', '.join(mine)} after the script go to the script, not to "
                   "gradtool trace: put gradtool's options before the script (and the script's "
                   "after --)", err=True)


def _workers(value: str | None) -> str | None:
    if value is None or value == "auto" or (value.isdigit() and int(value) >= 1):
        return value
    raise click.BadParameter(f"{value!r}: expected a positive number of workers or 'auto'")


CHECK_EPILOG = "\b\nInputs:\n" + INPUT_HELP


@main.command(cls=Command, context_settings=CONTEXT, epilog=CHECK_EPILOG)
@click.argument("targets", nargs=-1)
@check_options
@click.option("--eps", type=float, default=None, help="Finite-difference step [dtype default].")
@click.option("--atol", type=float, default=None, help="Absolute tolerance, gradcheck's meaning [float64: measured from "
                   "the finite-difference error; 1e-5 beside --rtol].")
@click.option("--rtol", type=float, default=None, help="Relative tolerance, gradcheck's meaning [float64: measured; 1e-3 "
                   "beside --atol].")
@click.option("--nondet-tol", type=float, default=None,
              help="Allowed difference between two backward calls [0].")
@click.option("--mode", type=click.Choice(MODES), default=None,
              help="full: every Jacobian element; probe: random projections; "
                   "auto: full while cheap [auto].")
@click.option("--check", "checks", multiple=True, type=click.Choice(CHECK_NAMES),
              help="Run only these checks (repeat) [every check the target has a face for; "
                   "compiled only when named].")
@click.option("--reference", metavar="MODULE:FN", default=None,
              help="float64 reference of a low-precision kernel [the target in float64].")
@click.option("--autocast", type=click.Choice(["float16", "bfloat16"]), default=None,
              help="Run forward in a torch.autocast region of this dtype.")
@click.option("--probes", type=click.IntRange(min=1), default=None,
              help="Probe budget in probe mode: 4 gives one random direction tested against "
                   "two random cotangents; each further 4 add a direction [4].")
@click.option("--max-memory", type=float, default=None,
              help="Bytes a full-mode Jacobian may take before refusing [2e9].")
@click.option("--strict/--no-strict", default=None,
              help="Inconclusive checks and warnings fail the run.")
@click.option("--masked/--no-masked", default=None,
              help="Sparse inputs: compare their specified elements only (gradcheck's masked) "
                   "[every element].")
@click.option("--exhaustive/--no-exhaustive", default=None,
              help="Gather every piece of evidence after a failure: no check stops at its "
                   "first confirmed failing block on an expensive target [stop].")
@click.option("--resample", type=int, default=None,
              help="Draw up to N new inputs when a case is inconclusive (kinks, ties).")
@click.option("--trust-callables", is_flag=True, default=False,
              help="Let specs that say trust_callable: true run a plain callable from an "
                   "installed package.")
@click.option("--save-inputs", type=click.Path(dir_okay=False), default=None,
              help="Write the inputs each case used to this .pt file (--inputs-from replays it).")
@report_options
@click.option("--repro", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="For each failing target, shrink the failing case and write "
                   "DIR/test_<target>.py, a standalone pytest file that fails the same way.")
@click.option("--repro-budget", type=click.IntRange(min=1), default=None, metavar="N",
              help="Checks --repro may run per failing target while shrinking [40].")
@click.option("--show-config", is_flag=True,
              help="Print the effective settings and where each came from, then exit.")
@isolation_options
@guarded
def check(**kw: Any) -> ExitCode:
    """Check the gradients of TARGETS: module:Name, path/file.py:Name, a module or file
    alone (every Function, nn.Module and custom op in it), a custom op as ns::name (after
    --import or file.py:), a YAML spec file, or a folder of specs.

    With no TARGETS, checks the paths configured in [tool.gradtool] of pyproject.toml."""
    from .commands import run_check
    from .options import CheckOptions

    return run_check(CheckOptions.from_click(kw))


@main.command(cls=Command, context_settings=CONTEXT, epilog=CHECK_EPILOG)
@click.argument("target")
@check_options
@click.option("--format", "fmt", type=click.Choice(["tree", "dot", "mermaid", "json"]),
              default="tree", help="Output format [tree].")
@click.option("--grads", is_flag=True,
              help="Run backward and annotate each node with gradient norms (flags NaN/Inf/zero).")
@click.option("--depth", type=click.IntRange(min=0), default=None,
              help="Show at most N levels below the outputs.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write to this file instead of stdout.")
@guarded
def graph(**kw: Any) -> ExitCode:
    """Show the autograd graph that TARGET's forward records (what backward will walk).

    Exit code 1 with --grads when a gradient turns NaN/Inf or dies (all zero) at some node."""
    from .commands import run_graph
    from .options import GraphOptions

    return run_graph(GraphOptions.from_click(kw))


@main.command("list", cls=Command, context_settings=CONTEXT, epilog=CHECK_EPILOG)
@click.argument("targets", nargs=-1)
@check_options
@click.option("--rules", is_flag=True, default=False,
              help="List every rule id (check.rule) with its severity, the ids `ignore:` "
                   "takes; with no target, only the rules.")
@guarded
def list_(**kw: Any) -> ExitCode:
    """List what `gradtool check` would check (targets, specs, inputs) without running checks."""
    from .commands import run_list
    from .options import ListOptions

    return run_list(ListOptions.from_click(kw))


@main.command(context_settings=CONTEXT)
@guarded
def config() -> ExitCode:
    """Print the effective settings ([tool.gradtool] in pyproject.toml) and their sources."""
    from ..config.pyproject import discover, merge, render_effective

    settings, sources = merge(discover(Path.cwd()), {})
    click.echo(render_effective(settings, sources))
    return ExitCode.OK


@main.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.argument("script", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("-m", "--module", default=None, metavar="MODULE",
              help="Run a module as `python -m MODULE` does, instead of a script file.")
@click.option("--max-calls", type=click.IntRange(min=1), default=1000,
              help="Record at most N distinct custom calls (class or op, shapes, dtypes, "
                   "strides) [1000].")
@click.option("--save", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Keep the recorded inputs in DIR, one .pt file per call (gradtool check "
                   "--inputs-from replays one).")
@click.option("--list", "list_", is_flag=True,
              help="Only show what the script called (recorded calls), without checking.")
@click.option("--check", "checks", multiple=True, type=click.Choice(CHECK_NAMES),
              help="Run only these checks on each recorded call (repeat).")
@click.option("--mode", type=click.Choice(MODES), default=None, help="Jacobian mode [auto].")
@click.option("--device", default=None,
              help="Device the recorded calls are replayed on, e.g. cuda [cpu].")
@click.option("--atol", type=float, default=None, help="Absolute tolerance [per dtype].")
@click.option("--rtol", type=float, default=None, help="Relative tolerance [per dtype].")
@click.option("--strict/--no-strict", default=None,
              help="Inconclusive checks and warnings fail the run.")
@report_options
@click.option("-n", "--workers", default=None, metavar="N|auto",
              callback=lambda _c, _p, v: _workers(v),
              help="Worker processes checking the recorded calls in parallel [1].")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Seconds the script may run, and each recorded call's checks (0: no limit) "
                   "[600].")
@click.option("--max-rss", type=click.IntRange(min=1), default=None, metavar="BYTES",
              help="Memory each checking worker may allocate [no limit].")
@guarded
def trace(**kw: Any) -> ExitCode:
    """Run SCRIPT once (its ARGS after --), record every call of a custom autograd.Function or
    custom op with its inputs, and check each distinct call on the inputs it received.

    \b
    gradtool trace train.py -- --epochs 1
    gradtool trace -n auto --save traced/ -m mypkg.train -- --steps 5"""
    from .options import TraceOptions
    from .trace import run_trace

    args = tuple(kw.pop("args") or ())
    if args[:1] == ("--",):
        args = args[1:]
    else:
        _warn_misplaced(args)
    return run_trace(TraceOptions.from_click({**kw, "args": args}))
