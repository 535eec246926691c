#!/usr/bin/env bash
# Torch compatibility run (not per-commit CI): a venv for one torch version, then the whole suite,
# `gradtool check specs/` and the bundled custom-op example, against a snapshot of HEAD.
#
#   .ci/compat.sh 2.6.0                       # results in $GRADTOOL_COMPAT_LOGS/torch-2.6.0.log
#   .ci/compat.sh 2.6.0 tests/test_trace.py   # only some tests (pytest's arguments)
#
# The registry's wheels other than the pinned CPU one are CUDA builds (~3 GB with the nvidia
# packages); they run on a CPU-only machine. Venvs are kept and reused (one install per version).
# GRADTOOL_COMPAT_JOBS sets pytest's worker count (default 1: a shared machine); `nice` throughout.
set -uo pipefail
version="${1:?usage: .ci/compat.sh TORCH_VERSION [PYTEST_ARGS...]}"
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
venvs="${GRADTOOL_COMPAT_VENVS:-/work/compat-venvs}"
logs="${GRADTOOL_COMPAT_LOGS:-/work/compat-logs}"
jobs="${GRADTOOL_COMPAT_JOBS:-1}"
venv="$venvs/torch-$version"
log="$logs/torch-$version.log"
mkdir -p "$venvs" "$logs"

say() { echo "== $*" | tee -a "$log"; }

# The machine's pip constraints may cap torch below the registry's newest; the matrix asks for an
# exact version, so an empty constraints file lifts the cap for this venv only.
no_cap="$(mktemp)"
if [ ! -f "$venv/bin/gradtool-compat-ready" ]; then
  say "installing torch==$version into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >>"$log" 2>&1
  PIP_CONSTRAINT="$no_cap" nice "$venv/bin/pip" install -q "torch==$version" >>"$log" 2>&1 \
    || { say "FAILED: pip install torch==$version"; exit 1; }
  touch "$venv/bin/gradtool-compat-ready"
fi

# A snapshot of HEAD, so edits to the worktree during a long run do not change what is tested.
sha="$(git -C "$root" rev-parse --short HEAD)"
snap="$(mktemp -d)/gradtool-$sha"
mkdir -p "$snap" && git -C "$root" archive HEAD | tar -x -C "$snap"
PIP_CONSTRAINT="$no_cap" nice "$venv/bin/pip" install -q -e "$snap[test]" >>"$log" 2>&1 \
  || { say "FAILED: pip install gradtool at $sha"; exit 1; }

cd "$snap" || exit 1
export PATH="$venv/bin:$PATH"
# pip may have swapped torch to satisfy gradtool's requirement: test what was asked, or nothing.
have="$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')"
if [ "$have" != "$version" ]; then
  say "FAILED: the venv has torch $have, not $version (gradtool's torch requirement?)"
  exit 1
fi
say "$(gradtool --version) at $sha, $(date -u +%FT%TZ)"
say "suite: pytest -n $jobs"
nice pytest -n "$jobs" -q -p no:cacheprovider "$@" >>"$log" 2>&1
suite=$?
say "suite exit $suite: $(grep -E '(passed|failed|error).* in [0-9.]+s' "$log" | tail -1)"
nice gradtool check specs/ --quiet >>"$log" 2>&1
specs=$?
say "gradtool check specs/ exit $specs"
nice gradtool check specs/examples/custom_op.yaml >>"$log" 2>&1
op=$?
say "gradtool check specs/examples/custom_op.yaml exit $op"
rm -f "$no_cap"
printf 'torch %s at %s: suite %s, specs %s, custom op example %s\n' \
  "$version" "$sha" "$suite" "$specs" "$op" | tee "$logs/torch-$version.summary"
