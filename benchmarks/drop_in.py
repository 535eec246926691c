"""Real projects' own test suites run as written and under `pytest --gradtool-gradcheck`.

For each project (pinned, installed into a benchmark folder outside this repository, never
vendored): its test files that call gradcheck, run twice in fresh pytest processes — torch's
gradcheck, then the drop-in — each call timed by the same router (drop_in_probe.py). Calls are
matched by test and order within it; the result names every disagreement with both verdicts,
every exception gradtool raised that torch did not, per-call medians (all calls and tiny ones,
<= 100 elements), the first call, the calls' total and the processes' wall time both ways.

    python benchmarks/drop_in.py                    # both projects, env in /tmp/gradtool-dropin
    python benchmarks/drop_in.py --projects entmax  # one
Writes benchmarks/results/drop_in.json. Needs pip access to PyPI for the pinned packages.
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
TINY = 100  # elements: issue 47's "tiny problem"


@dataclass(frozen=True)
class Project:
    """A project whose own tests call gradcheck: the pin, where its tests sit, which to run."""

    name: str
    pin: str
    folder: str            # the tests' root below the env folder (pytest runs there)
    paths: tuple[str, ...]  # the test files that call gradcheck


PROJECTS = {
    # Sparse activations; the tests ship inside the wheel (entmax has no sdist on PyPI).
    "entmax": Project("entmax", "entmax==1.3", "site",
                      ("entmax/test_losses.py", "entmax/test_root_finding.py",
                       "entmax/test_topk.py")),
    # Rotations; the tests come from the sdist (test/, importing `from test import utils`).
    "roma": Project("roma", "roma==1.8.0", "roma-tests",
                    ("test/test_mappings.py", "test/test_utils.py",
                     "test/test_procrustes_derivatives.py")),
}


def setup(env: Path) -> None:
    """The pinned packages in env/site (--target, no deps: torch and numpy are this venv's)."""
    site = env / "site"
    pins = [p.pin for p in PROJECTS.values()]
    if not all((site / p.name).is_dir() for p in PROJECTS.values()):
        pip("install", "--no-deps", "--target", str(site), *pins)
    tests = env / "roma-tests" / "test"
    if not tests.is_dir():
        pip("download", "--no-binary", ":all:", "--no-deps", "-d", str(env / "dl"),
            PROJECTS["roma"].pin)
        sdist = next((env / "dl").glob("roma-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if "/test/" in m.name and m.isfile()]
            for member in members:  # drop the sdist's top folder: its __init__.py is a package
                member.name = member.name.split("/", 1)[1]
            archive.extractall(env / "roma-tests", members=members, filter="data")


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def run_suite(project: Project, env: Path, routed: bool) -> dict[str, Any]:
    """One pytest process over the project's test files; its calls and its wall time."""
    out = env / f"calls-{project.name}-{'gradtool' if routed else 'torch'}.json"
    environ = {**os.environ, "GRADTOOL_DROPIN_OUT": str(out), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(env / "site"), str(HERE)])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-p", "drop_in_probe", *project.paths] + (["--gradtool-gradcheck"] if routed else [])
    start = time.perf_counter()
    done = subprocess.run(command, cwd=env / project.folder, env=environ, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    tail = done.stdout.strip().splitlines()[-1:] or [done.stderr[-500:]]
    result = json.loads(out.read_text()) if out.exists() else {"calls": [], "tests": {}}
    return {**result, "wall_s": round(wall, 2), "summary": tail[0]}


def compare(torch_run: dict[str, Any], gradtool_run: dict[str, Any]) -> dict[str, Any]:
    """Calls matched by (test, order within it): agreement, disagreements, internal errors."""
    ours, theirs = keyed(gradtool_run["calls"]), keyed(torch_run["calls"])
    matched = sorted(set(ours) & set(theirs))
    differ = [key for key in matched if verdict(ours[key]) != verdict(theirs[key])]
    raised = [key for key in matched if ours[key][1] == "raised"
              and not (theirs[key][1] == "raised" and same_type(ours[key], theirs[key]))]
    return {
        "calls": {"torch": len(theirs), "gradtool": len(ours), "matched": len(matched),
                  "unmatched": [list(k) for k in sorted(set(ours) ^ set(theirs))]},
        "agree": len(matched) - len(differ),
        "disagreements": [described(key, theirs[key], ours[key]) for key in differ],
        "internal_errors": [described(key, theirs[key], ours[key]) for key in raised],
        "per_call_ms": medians([(theirs[k], ours[k]) for k in matched]),
        "tiny_per_call_ms": medians([(theirs[k], ours[k]) for k in matched
                                     if ours[k][5] <= TINY]),
        "first_call_ms": {"torch": ms(torch_run["calls"][0][2]) if torch_run["calls"] else None,
                          "gradtool": ms(gradtool_run["calls"][0][2])
                          if gradtool_run["calls"] else None},
        "calls_total_s": {"torch": total(torch_run), "gradtool": total(gradtool_run)},
        "wall_s": {"torch": torch_run["wall_s"], "gradtool": gradtool_run["wall_s"]},
        "pytest": {"torch": torch_run["summary"], "gradtool": gradtool_run["summary"]},
    }


def keyed(rows: list[list[Any]]) -> dict[tuple[str, int], list[Any]]:
    seen: dict[str, int] = {}
    out = {}
    for row in rows:
        where = row[3]
        seen[where] = seen.get(where, -1) + 1
        out[(where, seen[where])] = row
    return out


def verdict(row: list[Any]) -> str:
    """passed / failed / the exception type: what a test sees of the call."""
    return row[4].split(":", 1)[0] if row[1] == "raised" else row[1]


def same_type(a: list[Any], b: list[Any]) -> bool:
    return verdict(a) == verdict(b)


def described(key: tuple[str, int], torch_row: list[Any], ours: list[Any]) -> dict[str, Any]:
    return {"test": key[0], "call": key[1], "elements": ours[5],
            "torch": f"{torch_row[1]} {torch_row[4]}".strip(),
            "gradtool": f"{ours[1]} {ours[4]}".strip()}


def medians(pairs: list[tuple[list[Any], list[Any]]]) -> dict[str, Any]:
    if not pairs:
        return {"calls": 0}
    return {"calls": len(pairs),
            "torch": ms(statistics.median(t[2] for t, _ in pairs)),
            "gradtool": ms(statistics.median(g[2] for _, g in pairs)),
            "median_ratio": round(statistics.median(g[2] / max(t[2], 1e-9) for t, g in pairs), 2),
            "gradtool_slower_on": sum(g[2] > t[2] for t, g in pairs)}


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def total(run: dict[str, Any]) -> float:
    return round(sum(row[2] for row in run["calls"]), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", type=Path, default=Path("/tmp/gradtool-dropin"),
                        help="folder for the pinned packages and their tests")
    parser.add_argument("--projects", default=",".join(PROJECTS),
                        help=f"comma-separated, among {', '.join(PROJECTS)}")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    setup(args.env)
    results = {"load_before": os.getloadavg()[0], "projects": {}}
    for name in args.projects.split(","):
        project = PROJECTS[name]
        torch_run = run_suite(project, args.env, routed=False)
        gradtool_run = run_suite(project, args.env, routed=True)
        results["projects"][name] = {"pin": project.pin, "files": list(project.paths),
                                     **compare(torch_run, gradtool_run)}
        print(name, json.dumps(results["projects"][name], indent=1)[:3000], flush=True)
    results["load_after"] = os.getloadavg()[0]
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
