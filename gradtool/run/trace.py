"""`gradtool trace`, in the worker: run a script once, recording each distinct custom call's inputs.

The recording hooks Function.apply (and the Python entry points of torch.library ops) only: a
call whose signature was seen before costs one signature tuple; a new one is copied (detached),
written to a .pt file that `gradtool check --inputs-from` replays, and announced to the supervisor
at once, so a script that later raises, dies or hangs loses none of what it had recorded.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.autograd import Function

from ..targets.kinds import named
from ..targets.load import display_path
from ..tracebacks import trim
from .applyhook import definition_key
from .sites import user_site
from .trace_messages import Checked, Crashed, Ended, Layouts, Recorded, Refused, TraceMessage

Sink = Callable[[TraceMessage], None]
_PLAIN = (torch.Tensor, int, float, complex, bool, str, type(None), torch.dtype)
# Namespaces of torch's own operators: never the user's custom ops.
TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "quantized", "_quantized", "profiler",
                              "higher_order", "inductor", "c10d", "_c10d_functional",
                              "_c10d_functional_autograd", "debugprims", "rngprims", "mkldnn",
                              "mkl", "onednn", "xnnpack", "quantized_decomposed", "_dtensor",
                              "torchvision", "fbgemm", "_inductor_test", "symm_mem"})


class Recorder:
    """Announces each distinct (class or op, argument layouts) call once; counts the repeats."""

    def __init__(self, out_dir: str, max_calls: int, script: str, sink: Sink) -> None:
        self.out_dir, self.max_calls, self.script, self.sink = out_dir, max_calls, script, sink
        self.seen: dict[tuple[Any, ...], int] = {}  # signature -> index (-1: no grad)
        self.recorded = 0
        self.owners: dict[int, Any] = {}  # index -> the Function class or op name (in-process use)
        self.repeats: dict[int, int] = {}
        # index -> (Function class, args, kwargs) of calls whose arguments cannot be saved:
        # checked here once the script ends, on the arguments held as they were
        self.held: dict[int, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {}
        self.dropped = 0        # distinct calls past --max-calls
        self.no_grad = 0        # calls whose backward cannot run (grad mode off, nothing requires grad)
        self.pid = os.getpid()  # a forked child (a DataLoader worker) records nothing
        self.forks = False      # set once the script forks, so the hot path skips getpid
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)
        self.lock = threading.Lock()
        self.inside = threading.local()

    def _forked(self) -> None:
        self.forks = True

    def summary(self) -> dict[str, Any]:
        return {"repeats": dict(self.repeats), "dropped": self.dropped, "no_grad": self.no_grad}

    def around(self, kind: str, key: Any, label: str, owner: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any], call: Callable[[], Any]) -> Any:
        """Run `call` (the real apply or op), recording it first when it is new."""
        if getattr(self.inside, "busy", False) or (self.forks and os.getpid() != self.pid):
            return call()  # a call made by a recorded call (a custom op's autograd Function)
        self.inside.busy = True
        try:
            try:
                index = self._note(kind, key, label, owner, args, kwargs)
            except Exception:  # noqa: BLE001 - recording must never break the user's run
                index = None
            out = call()
            if index is not None:
                try:
                    self._watch_backward(index, out)
                except Exception:  # noqa: BLE001 - same: the layouts are a nicety
                    pass
            return out
        finally:
            self.inside.busy = False

    def _note(self, kind: str, key: Any, label: str, owner: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> int | None:
        # The hot path (a repeat): one signature tuple and one dict lookup.
        signature = (key, _signature(args), _signature(tuple(kwargs.items())) if kwargs else ())
        if not torch.is_grad_enabled():
            self.no_grad += 1
            return None
        with self.lock:
            index = self.seen.get(signature)
            if index is not None:
                if index < 0:  # nothing requires grad: its backward never runs
                    self.no_grad += 1
                else:
                    self.repeats[index] = self.repeats.get(index, 0) + 1
                return None
            if not _any_grad(signature[1:]):
                self.seen[signature] = -1
                self.no_grad += 1
                return None
            if self.recorded >= self.max_calls:
                self.dropped += 1
                return None
            index = self.seen[signature] = self.recorded
            self.recorded += 1
            self.owners[index] = owner
        self.sink(Recorded(self._save(index, kind, label, owner, args, kwargs)))
        return index

    def _save(self, index: int, kind: str, label: str, owner: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> dict[str, Any]:
        """Copy the inputs (before forward may write to them) into a .pt file; its facts."""
        site = user_site(sys._getframe(3))
        safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in label)
        path = os.path.join(self.out_dir, f"{index:03d}_{safe}.pt")
        facts = {"index": index, "kind": kind, "label": label, "site": site, "file": path,
                 "inputs": [describe(v) for v in _leaves((args, kwargs))
                            if isinstance(v, torch.Tensor)],
                 "dtypes": sorted({str(v.dtype).removeprefix("torch.") for v in _leaves(
                     (args, kwargs)) if isinstance(v, torch.Tensor)}),
                 "devices": sorted({str(v.device) for v in _leaves((args, kwargs))
                                    if isinstance(v, torch.Tensor)}),
                 "target": None, "problem": None}
        facts["target"], facts["problem"] = target_of(kind, owner, label, self.script)
        odd = next((v for v in _leaves((args, kwargs)) if not isinstance(v, _PLAIN)), None)
        if odd is not None:  # --inputs-from loads with weights_only: plain data only
            facts["target"], facts["problem"] = None, (
                f"{label} takes a {type(odd).__qualname__} argument: only tensors, numbers, "
                "strings and tuples/lists/dicts of them can be saved and replayed")
        # a class made inside a function (a library's factory: qpth's QPFunction(...)) has
        # no name to load; like arguments no file holds, it is checked in this process
        if named(kind).function_class and (odd is not None or "<locals>" in label):
            self.held[index] = (owner, tuple(_copy(a) for a in args),
                                {k: _copy(v) for k, v in kwargs.items()})
            return facts
        try:
            torch.save((tuple(_copy(a) for a in args), {k: _copy(v) for k, v in kwargs.items()}),
                       path)
        except Exception as exc:  # noqa: BLE001 - an argument torch.save cannot write
            facts["problem"] = (f"its arguments cannot be saved for replay "
                                f"({type(exc).__name__}: {str(exc)[:120]})")
        return facts

    def _watch_backward(self, index: int, out: Any) -> None:
        """The grad_outputs' layouts of this call's backward, the first time it runs."""
        nodes = {id(o.grad_fn): o.grad_fn for o in _leaves(out)
                 if isinstance(o, torch.Tensor) and o.grad_fn is not None}
        for node in list(nodes.values())[:1]:
            def seen(grad_outputs: Any, node: Any = node) -> None:
                self.sink(Layouts(index, tuple(describe(g) if isinstance(g, torch.Tensor)
                                               else "none" for g in grad_outputs)))
                handle.remove()  # once is enough: later backwards cost nothing

            handle = node.register_prehook(seen)


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _any_grad(signature: Any) -> bool:
    """Whether a signature holds a tensor that requires grad (its last field)."""
    if isinstance(signature, tuple):
        if signature[:1] == ("T",):
            return bool(signature[-1])
        return any(_any_grad(part) for part in signature)
    return False


def _signature(value: Any) -> Any:
    """What makes two calls the same for a check: shapes, dtypes, strides, devices, grad flags;
    small literals by value (a scale changes the Function), other objects by type."""
    if isinstance(value, torch.Tensor):  # torch.Size and torch.device hash as they are
        return ("T", value.shape, value.dtype, value.stride(), value.device, value.requires_grad)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple([_signature(v) for v in value]))
    if isinstance(value, (int, float, bool, str, type(None))):
        return ("V", value)
    return ("O", type(value).__qualname__)


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (tuple, list)):
        return type(value)(_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def describe(tensor: torch.Tensor) -> str:
    """'8x40 float32', with ', strides (1, 8)' when not contiguous and the device when not cpu."""
    shape = "x".join(map(str, tensor.shape)) if tensor.dim() else "scalar"
    text = f"{shape} {str(tensor.dtype).removeprefix('torch.')}"
    if not tensor.is_contiguous():
        text += f", strides {tuple(tensor.stride())}"
    return text + (f" on {tensor.device}" if tensor.device.type != "cpu" else "")


def target_of(kind: str, owner: Any, label: str, script: str) -> tuple[str | None, str | None]:
    """The target string a check worker (and the reproduce line) loads, or why there is none."""
    if named(kind).op:
        return _op_target(owner, label)
    qualname = owner.__qualname__
    if "<locals>" in qualname:
        return None, (f"{qualname} is defined inside a function: it cannot be loaded by name to "
                      "be checked; define it at module level")
    module = sys.modules.get(owner.__module__)
    if owner.__module__ == "__main__":  # the script itself (loaded by name, it is not main)
        where = display_path(script) if script.endswith(".py") else script  # or -m's module
        return f"{where}:{qualname}", None
    if module is not None and getattr(module, "__package__", None):
        from .reproduce import loadable_location  # its name where that imports, else its file

        return f"{loadable_location(owner.__module__)}:{qualname}", None
    file = getattr(module, "__file__", None)
    return (f"{display_path(file)}:{qualname}" if file else f"{owner.__module__}:{qualname}"), None


def _op_target(op_name: str, label: str) -> tuple[str | None, str | None]:
    """A torch.library.custom_op is replayed through the function object it decorates."""
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(op_name)
    fn = getattr(opdef, "_init_fn", None)
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    name = getattr(fn, "__name__", None)
    if opdef is None or module is None or getattr(module, name or "", None) is not opdef:
        return None, (f"{label} is not a torch.library.custom_op bound to a module-level name: "
                      "it is recorded, but only ops defined with @custom_op can be replayed")
    file = getattr(module, "__file__", None)
    where = module.__name__ if getattr(module, "__package__", None) or not file \
        else display_path(file)
    return f"{where}:{name}", None


@contextmanager
def hooked(recorder: Recorder) -> Iterator[None]:
    """Wrap Function.apply and the op entry points for the run; always put them back."""
    from torch._ops import OpOverload, OpOverloadPacket

    # A classmethod up to torch 2.13, a C classmethod_descriptor since 2.14: both bind by
    # __get__. Set before the script runs, so its aliases (my_op = Cls.apply) bind to ours.
    apply = Function.__dict__["apply"]

    def traced_apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        original = apply.__get__(None, cls)
        if cls.__module__.split(".")[0] == "torch":  # checkpointing, custom ops' own Functions
            return original(*args, **kwargs)
        return recorder.around("function", definition_key(cls), cls.__qualname__, cls, args,
                               kwargs, lambda: original(*args, **kwargs))

    patched = {OpOverloadPacket: OpOverloadPacket.__dict__["__call__"],
               OpOverload: OpOverload.__dict__["__call__"]}

    def op_call(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            namespace = getattr(self, "namespace", None) or \
                str(getattr(self, "_qualified_op_name", "aten::")).split("::")[0]
            if namespace in TORCH_NAMESPACES:
                return original(self, *args, **kwargs)
            name = f"{namespace}::{_op_short_name(self)}"
            return recorder.around("op", name, name, name, args, kwargs,
                                   lambda: original(self, *args, **kwargs))
        return call

    Function.apply = classmethod(traced_apply)  # type: ignore[method-assign,assignment]
    for cls, original in patched.items():
        cls.__call__ = op_call(original)  # type: ignore[method-assign]
    try:
        yield
    finally:
        Function.apply = apply  # type: ignore[method-assign]
        for cls, original in patched.items():
            cls.__call__ = original  # type: ignore[method-assign]


def _op_short_name(op: Any) -> str:
    name = getattr(op, "_qualified_op_name", None) or str(getattr(op, "name", lambda: "")())
    return name.split("::")[-1] if name else str(op)


def run_script(spec: dict[str, Any], recorder: Recorder) -> tuple[str, str]:
    """Run the script as `python script.py ARGS` would; ("ok" | "raised" | "exit", detail)."""
    module, path, args = spec.get("module"), spec.get("path"), list(spec.get("args") or ())
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    try:
        if module:
            sys.argv = [module, *args]  # run_module puts the module's file in argv[0]
            sys.path.insert(0, os.getcwd())
            with hooked(recorder):
                runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [path, *args]
            sys.path.insert(0, str(Path(path).resolve().parent))
            with hooked(recorder):
                runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            return "exit", str(exc.code)
    except BaseException as exc:  # noqa: BLE001 - the user's script raising is a result
        return "raised", trim(exc)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return "ok", ""


def serve(conn: Any, spec: dict[str, Any]) -> None:
    """The recording worker: run the script, stream what it calls, then say how it ended."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    try:
        module = spec.get("module")
        if module and _find(module) is None:
            conn.send(Refused(f"-m {module}: no module named {module!r}",
                              "give an importable module (run from the folder that holds it)"))
            return
        os.dup2(2, 1)  # the script's prints go to stderr: stdout carries only the report
        sys.stdout = sys.stderr
        recorder = Recorder(spec["out_dir"], spec["max_calls"], spec.get("path") or
                            spec.get("module") or "", conn.send)
        status = run_script(spec, recorder)
        for index, result in check_held(recorder, spec.get("config")):
            conn.send(Checked(index, result))
        conn.send(Ended(status, recorder.summary()))
        import atexit

        atexit._run_exitfuncs()  # the script's own (a worker process exits without them)
    except BaseException:  # noqa: BLE001 - a bug here is gradtool's; say so, do not hang
        conn.send(Crashed(traceback.format_exc()))


def check_held(recorder: Recorder, config: Any) -> Iterator[tuple[int, Any]]:
    """Each held call (arguments that cannot be saved: a callable, an options object) checked
    here, where those arguments still live, as gradtool.check would on them."""
    from ..targets.inputs import parse_input
    from ..targets.values import given_specs
    from .collect import Run, Sources

    if config is None:
        return
    for index, (owner, args, kwargs) in recorder.held.items():
        specs = given_specs(list(args), kwargs or None, parse_input)
        dtypes = {str(v.dtype).removeprefix("torch.") for v in _leaves((args, kwargs))
                  if isinstance(v, torch.Tensor) and v.is_floating_point()}
        own = config.with_(dtype=dtypes.pop()) if len(dtypes) == 1 else config  # its tolerances
        report = Run((owner,), own, Sources(given=tuple(specs)), empty_ok=True).report()
        found = report.targets or report.rejected
        if found:
            yield index, found[0]


def _find(module: str) -> Any:
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path.pop(0)
