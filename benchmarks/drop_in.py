"""Real projects' own test suites run as written and under `pytest --gradtool-gradcheck`.

For each project (pinned, installed into a benchmark folder outside this repository, never
vendored): its test files that call gradcheck, run three times in fresh pytest processes, each
call timed by the same router (drop_in_probe.py): as written (torch's gradcheck), under
--gradtool-gradcheck, and paired (each call run by both, on the same inputs, at the same moment,
the test going on with torch's result). The first two give the tests' outcomes, the first call,
the calls' total and the processes' wall time both ways; the paired run gives every disagreement
with both verdicts, every exception gradtool raised that torch did not, and per-call medians (all
calls, and tiny ones of <= 100 elements), which a shared machine's load would blur across runs.

    python benchmarks/drop_in.py                    # every project, env in /tmp/gradtool-dropin
    python benchmarks/drop_in.py --projects entmax  # one
    python benchmarks/drop_in.py --seed-bug         # each project's own backward made wrong
    python benchmarks/drop_in.py --seed-bug double  # only the gradients' own derivative wrong
    python benchmarks/drop_in.py --seed-bug --modes paired --gradtool-from ../other-checkout
Writes benchmarks/results/drop_in.json (drop_in_seeded.json with --seed-bug,
drop_in_seeded_double.json with --seed-bug double). Needs pip access to PyPI for the pinned
packages.

None of the suites fails a gradcheck call as published, so --seed-bug plants a real bug for the
failing path: drop_in_seed.py (a pytest plugin, `-p drop_in_seed`) scales the gradients that
chosen torch.autograd.Functions of the installed project return by 1.01 (or, `double`, only their
derivative), at pytest's configure time, in the test process only (the installed files are never
edited), and counts their calls. Only the test files whose gradcheck calls reach those
Functions run. --modes picks among the three runs; --gradtool-from measures another checkout's
gradtool (each entry names the commit it measured). Beyond the comparison above,
the seeded run splits the paired calls into failing ones (torch's gradcheck or the drop-in
failed them) and passing ones: verdicts, per-call medians and totals, the seeded Functions'
applies and backwards per tool, and the failing calls that took the drop-in longest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "drop_in.json"
SEEDED = HERE / "results" / "drop_in_seeded.json"
SEEDED_DOUBLE = HERE / "results" / "drop_in_seeded_double.json"
MODES = ("torch", "gradtool", "paired")
TINY = 100  # elements: issue 47's "tiny problem"


@dataclass(frozen=True)
class Seed:
    """A bug for --seed-bug: the Functions whose backward drop_in_seed.py scales by 1.01, and
    the project's test files whose gradcheck calls reach them."""

    targets: tuple[str, ...]  # module:Class, each a torch.autograd.Function of the project
    paths: tuple[str, ...]


@dataclass(frozen=True)
class Project:
    """A project whose own tests call gradcheck: the pin, where its tests sit, which to run."""

    name: str
    pin: str
    folder: str            # the tests' root below the env folder (pytest runs there)
    paths: tuple[str, ...]  # the test files that call gradcheck
    deps: tuple[str, ...] = ()  # pinned too, beyond this environment's torch and numpy
    seed: Seed | None = None


PROJECTS = {
    # Sparse activations; the tests ship inside the wheel (entmax has no sdist on PyPI).
    "entmax": Project("entmax", "entmax==1.3", "site",
                      ("entmax/test_losses.py", "entmax/test_root_finding.py",
                       "entmax/test_topk.py"),
                      # the losses' shared backward (test_loss's 140 calls) and the bisection's
                      seed=Seed(("entmax.losses:_GenericLossFunction",
                                 "entmax.root_finding:EntmaxBisectFunction"),
                                ("entmax/test_losses.py", "entmax/test_root_finding.py"))),
    # Rotations; the tests come from the sdist (test/, importing `from test import utils`).
    "roma": Project("roma", "roma==1.8.0", "roma-tests",
                    ("test/test_mappings.py", "test/test_utils.py",
                     "test/test_procrustes_derivatives.py"),
                    # the special Procrustes' hand-written derivatives
                    seed=Seed(("roma.mappings:_ProcrustesManualDerivatives",),
                              ("test/test_procrustes_derivatives.py",))),
    # Differentiable scientific computing (linear algebra, optimisation, integration,
    # interpolation); not tuned on. Its tests ship inside the wheel (xitorch/_tests): every file
    # that calls gradcheck or gradgradcheck.
    "xitorch": Project("xitorch", "xitorch==0.5.1", "site",
                       ("xitorch/_tests/test_optimize.py", "xitorch/_tests/test_interp.py",
                        "xitorch/_tests/test_jac.py", "xitorch/_tests/test_linop_fcns.py",
                        "xitorch/_tests/test_integrate.py"), ("scipy==1.17.1",),
                       # the ODE adjoint (solve_ivp's backward: test_ivp) and the implicit
                       # gradient of rootfinder, equilibrium and minimize (test_optimize.py)
                       seed=Seed(("xitorch.integrate.solve_ivp:_SolveIVP",
                                  "xitorch.optimize.rootfinder:_RootFinder"),
                                 ("xitorch/_tests/test_integrate.py",
                                  "xitorch/_tests/test_optimize.py"))),
}


def setup(env: Path, projects: list[Project]) -> None:
    """The pinned packages in env/site (--target, no deps: torch and numpy are this venv's)."""
    site = env / "site"
    missing = [p for p in projects if not (site / p.name).is_dir()]
    if missing:
        pip("install", "--no-deps", "--upgrade", "--target", str(site),
            *[pin for p in missing for pin in (p.pin, *p.deps)])
    tests = env / "roma-tests" / "test"
    if PROJECTS["roma"] in projects and not tests.is_dir():
        pip("download", "--no-binary", ":all:", "--no-deps", "-d", str(env / "dl"),
            PROJECTS["roma"].pin)
        sdist = next((env / "dl").glob("roma-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if "/test/" in m.name and m.isfile()]
            for member in members:  # drop the sdist's top folder: its __init__.py is a package
                member.name = member.name.split("/", 1)[1]
            archive.extractall(env / "roma-tests", members=members, filter="data")


def commit(checkout: Path) -> str | None:
    """The checkout's commit (and a + where its files differ from it), None outside git."""
    done = subprocess.run(["git", "-C", str(checkout), "describe", "--always", "--dirty=+"],
                          capture_output=True, text=True)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def run_suite(project: Project, env: Path, mode: str, seeded: str | None = None,
              gradtool_from: Path = HERE.parent) -> dict[str, Any]:
    """One pytest process over the project's test files (mode: torch, gradtool or paired), with
    the project's seeded bug of that kind planted if asked (and only its test files run)."""
    tag = {None: "", "first": "-seeded", "double": "-seeded-double"}[seeded]
    out = env / f"calls-{project.name}-{mode}{tag}.json"
    environ = {**os.environ, "GRADTOOL_DROPIN_OUT": str(out), "OMP_NUM_THREADS": "1",
               # gradtool from this checkout (not whatever the environment installed)
               "PYTHONPATH": os.pathsep.join([str(env / "site"), str(HERE), str(gradtool_from)])}
    if mode == "paired":
        environ["GRADTOOL_DROPIN_PAIRED"] = "1"
    paths, plugins = project.paths, ["-p", "drop_in_probe"]
    if seeded and project.seed is not None:
        environ["GRADTOOL_DROPIN_SEED"] = ",".join(project.seed.targets)
        environ["GRADTOOL_DROPIN_SEED_KIND"] = seeded
        paths, plugins = project.seed.paths, ["-p", "drop_in_seed", *plugins]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10",
               *plugins, *paths]
    command += ["--gradtool-gradcheck"] if mode == "gradtool" else []
    start = time.perf_counter()
    done = subprocess.run(command, cwd=env / project.folder, env=environ, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    out.with_suffix(".log").write_text(done.stdout + done.stderr)  # failures, slowest tests
    tail = done.stdout.strip().splitlines()[-1:] or [done.stderr[-500:]]
    result = json.loads(out.read_text()) if out.exists() else {"calls": [], "pairs": []}
    return {**result, "wall_s": round(wall, 2), "summary": tail[0]}


def compare(torch_run: dict[str, Any], gradtool_run: dict[str, Any],
            paired: dict[str, Any]) -> dict[str, Any]:
    """The suite both ways (tests, first call, totals, wall time, each call's verdict matched by
    test and order), and the paired run: verdicts on identical inputs, per-call times."""
    ours, theirs = keyed(gradtool_run["calls"]), keyed(torch_run["calls"])
    matched = sorted(set(ours) & set(theirs))
    pairs = paired["pairs"]
    differ = [p for p in pairs if verdict(p["torch"]) != verdict(p["gradtool"])]
    raised = [p for p in pairs if p["gradtool"][0] == "raised"
              and verdict(p["gradtool"]) != verdict(p["torch"])]
    return {
        "pytest": {"torch": torch_run["summary"], "gradtool": gradtool_run["summary"]},
        "calls": {"torch": len(theirs), "gradtool": len(ours), "paired": len(pairs)},
        "separate_runs_agree": sum(verdict(ours[k]) == verdict(theirs[k]) for k in matched),
        "separate_runs_matched": len(matched),
        "first_call_ms": {"torch": first(torch_run), "gradtool": first(gradtool_run)},
        "calls_total_s": {"torch": total(torch_run), "gradtool": total(gradtool_run)},
        "wall_s": {"torch": torch_run["wall_s"], "gradtool": gradtool_run["wall_s"]},
        "paired_agree": len(pairs) - len(differ),
        "disagreements": [described(p) for p in differ],
        "internal_errors": [described(p) for p in raised],
        "per_call_ms": medians(pairs),
        "tiny_per_call_ms": medians([p for p in pairs if p["elements"] <= TINY]),
        "paired_total_s": {tool: round(sum(p[tool][1] for p in pairs), 2)
                           for tool in ("torch", "gradtool")},
    }


def seeded_split(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """The paired calls split by the seeded bug: failing (either tool failed the call) and
    passing; for each, the verdicts, per-call medians, totals, and the seeded Functions' applies
    and backwards per tool; the failing calls that took the drop-in longest."""
    failing = [p for p in pairs if "failed" in (verdict(p["torch"]), verdict(p["gradtool"]))]
    passing = [p for p in pairs if p not in failing]
    return {"failing": split_part(failing), "passing": split_part(passing),
            "torch_failed_gradtool_passed": [described(p) for p in failing
                                             if verdict(p["gradtool"]) != "failed"],
            "gradtool_failed_torch_passed": [described(p) for p in failing
                                             if verdict(p["torch"]) != "failed"],
            "slowest_failing": [{**described(p), "seconds": [round(p["torch"][1], 3),
                                                             round(p["gradtool"][1], 3)],
                                 "evals": p.get("evals")}
                                for p in sorted(failing, key=lambda p: -p["gradtool"][1])[:12]]}


def split_part(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    totals = {tool: round(sum(p[tool][1] for p in pairs), 2) for tool in ("torch", "gradtool")}
    return {"calls": len(pairs),
            "failed": {tool: sum(verdict(p[tool]) == "failed" for p in pairs)
                       for tool in ("torch", "gradtool")},
            "per_call_ms": medians(pairs), "total_s": totals,
            "total_ratio": round(totals["gradtool"] / max(totals["torch"], 1e-9), 2),
            "evals": {tool: [sum(p.get("evals", {}).get(tool, (0, 0))[i] for p in pairs)
                             for i in (0, 1)] for tool in ("torch", "gradtool")}}


def keyed(rows: list[list[Any]]) -> dict[tuple[str, int], list[Any]]:
    seen: dict[str, int] = {}
    out = {}
    for row in rows:
        where = row[3]
        seen[where] = seen.get(where, -1) + 1
        out[(where, seen[where])] = row
    return out


def verdict(row: list[Any]) -> str:
    """passed / failed / the exception's type: what a test sees of the call (a call row of
    run/swap.py's Call.row(), or one side of a pair: outcome, seconds, error)."""
    outcome, error = (row[1], row[4]) if len(row) == 6 else (row[0], row[2])
    return error.split(":", 1)[0] if outcome == "raised" else outcome


def described(pair: dict[str, Any]) -> dict[str, Any]:
    return {"test": pair["where"], "function": pair["name"], "elements": pair["elements"],
            "torch": " ".join(map(str, pair["torch"][::2])).strip(),
            "gradtool": " ".join(map(str, pair["gradtool"][::2])).strip()}


def medians(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    if not pairs:
        return {"calls": 0}
    torch_s = [p["torch"][1] for p in pairs]
    ours = [p["gradtool"][1] for p in pairs]
    return {"calls": len(pairs), "torch": ms(statistics.median(torch_s)),
            "gradtool": ms(statistics.median(ours)),
            "median_ratio": round(statistics.median(g / max(t, 1e-9)
                                                    for t, g in zip(torch_s, ours)), 2),
            "gradtool_slower_on": sum(g > t for t, g in zip(torch_s, ours))}


def first(run: dict[str, Any]) -> float | None:
    return ms(run["calls"][0][2]) if run["calls"] else None


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def total(run: dict[str, Any]) -> float:
    return round(sum(row[2] for row in run["calls"]), 2)


def main() -> None:
    """Set the folder up, run each project both ways, write the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", type=Path, default=Path("/tmp/gradtool-dropin"),
                        help="folder for the pinned packages and their tests")
    parser.add_argument("--projects", default=",".join(PROJECTS),
                        help=f"comma-separated, among {', '.join(PROJECTS)}")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"default {RESULTS.name}, or {SEEDED.name} with --seed-bug")
    parser.add_argument("--seed-bug", nargs="?", const="first", choices=("first", "double"),
                        help="plant each project's seeded bug (drop_in_seed.py) and run only the "
                             "test files that reach it: first (the gradients x1.01, the default) "
                             "or double (only their derivative: gradgradcheck's calls fail)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated among torch, gradtool, paired (the paired run "
                             "alone gives verdicts and per-call times on identical inputs)")
    parser.add_argument("--gradtool-from", type=Path, default=HERE.parent,
                        help="the checkout whose gradtool the suites import (default this one)")
    args = parser.parse_args()
    projects = [PROJECTS[name] for name in args.projects.split(",")]
    modes = args.modes.split(",")
    out = args.out or {None: RESULTS, "first": SEEDED, "double": SEEDED_DOUBLE}[args.seed_bug]
    setup(args.env, projects)
    # the projects not run keep their last run's entry (each entry says its own time and load)
    kept = json.loads(out.read_text()).get("projects", {}) if out.exists() else {}
    results = {"projects": kept}
    for project in projects:
        load = os.getloadavg()[0]
        runs = {mode: run_suite(project, args.env, mode, args.seed_bug, args.gradtool_from)
                if mode in modes else {"calls": [], "pairs": [], "wall_s": None, "summary": None}
                for mode in MODES}
        seeded = bool(args.seed_bug) and project.seed is not None
        results["projects"][project.name] = {
            "pin": project.pin, "deps": list(project.deps),
            "files": list(project.seed.paths if seeded else project.paths),
            **({"seeded": list(project.seed.targets), "scale": 1.01, "kind": args.seed_bug}
               if seeded else {}),
            "gradtool_from": str(args.gradtool_from), "commit": commit(args.gradtool_from),
            "modes": modes,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_before": load, "load_after": os.getloadavg()[0], **compare(*runs.values()),
            **({"seeded_split": seeded_split(runs["paired"]["pairs"])} if seeded else {})}
        print(project.name, json.dumps(results["projects"][project.name], indent=1)[:3000],
              flush=True)
        out.write_text(json.dumps(results, indent=1) + "\n")  # after each project


if __name__ == "__main__":
    main()
