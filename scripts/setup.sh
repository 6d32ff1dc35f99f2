#!/usr/bin/env bash
# Prepare the Python environment in .venv, installing only what is missing.
#
#   bash scripts/setup.sh
#
# Safe to run any number of times: when everything is in place it checks by
# importing and returns in a few seconds. What it installs:
#   - torch: on a machine without a CUDA GPU, the CPU build torch==2.13.0; on a
#     machine with one, the venv sees the system's packages and an installed
#     torch is kept as found;
#   - triton, numpy, biopython, ml-collections, dm-tree, scipy, tqdm,
#     matplotlib, pytest, pytest-xdist, hypothesis, modelcif==1.8 (mmCIF output;
#     brings ihm) and gemmi==0.7.5 (reads it back in the tests);
#   - with FLASHLIGHT_SETUP_RELAX=1 (or --relax): openmm==8.6.1 and
#     pdbfixer==1.12.0, for flashlight-fold --relax (Amber relaxation);
#   - openfold==0.0.1, built from the registry's sdist (see build_openfold);
#   - this repository, editable, as the package "flashlight".
# Installer output goes to .venv/setup.log; on failure the script prints its
# tail and what to do.
#
# Environment:
#   PYTHON                  interpreter that creates .venv (default: python3)
#   FLASHLIGHT_VENV         where the environment lives (default: <repo>/.venv)
#   FLASHLIGHT_TORCH_SPEC   torch requirement used on machines without a CUDA GPU
#                           (default: torch==2.13.0)
#   FLASHLIGHT_SETUP_RELAX  1: also install OpenMM and PDBFixer (same as --relax)
set -euo pipefail

SETUP_RELAX="${FLASHLIGHT_SETUP_RELAX:-0}"
for arg in "$@"; do
    case "$arg" in
        --relax) SETUP_RELAX=1 ;;
        *) printf 'setup: unknown argument %s (known: --relax)\n' "$arg" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLASHLIGHT_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
TORCH_CPU_SPEC="${FLASHLIGHT_TORCH_SPEC:-torch==2.13.0}"
OPENFOLD_SPEC="openfold==0.0.1"
MODELCIF_SPEC="modelcif==1.8"
GEMMI_SPEC="gemmi==0.7.5"
OPENMM_SPEC="openmm==8.6.1"
PDBFIXER_SPEC="pdbfixer==1.12.0"
STAMP="$VENV/.flashlight-install"
LOG="$(mktemp "${TMPDIR:-/tmp}/flashlight-setup.XXXXXX.log")"
START=$SECONDS
STEP_START=1  # first log line of the step being run

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore PIP_PROGRESS_BAR=off

say() { printf 'setup: %s\n' "$*" >&2; }

# Known failures: a pattern found in the installer log, and what to do about it.
# The first pattern that matches wins; order matters (pip reports an unreachable
# index as "no matching distribution" too).
KNOWN_FAILURES=(
    "Failed to establish a new connection|Temporary failure in name resolution|Name or service not known|Network is unreachable|ConnectTimeout|ReadTimeout|Max retries exceeded|ProxyError|SSLError|Connection refused|Could not fetch URL"
    "The package registry cannot be reached. Check the network or proxy (HTTPS_PROXY), or point pip at a reachable index or a folder of wheels (PIP_INDEX_URL, PIP_FIND_LINKS), then run this script again."
    "No space left on device"
    "The disk is full. Free some space (pip's cache: ~/.cache/pip; TMPDIR) and run again."
    "Python\\.h: No such file"
    "Python's C headers are missing (needed to build OpenFold's extension). Debian/Ubuntu: apt-get install python3-dev (or the python3.X-dev matching the venv's Python)."
    "(c\\+\\+|g\\+\\+|gcc|clang|cc): (command )?not found|No such file or directory: '[^']*(c\\+\\+|g\\+\\+|gcc|cc)'|command '[^']*(c\\+\\+|g\\+\\+|gcc|cc)' failed|unable to execute '[^']*(c\\+\\+|g\\+\\+|gcc|cc)'"
    "No C++ compiler was found (needed to build OpenFold's extension). Debian/Ubuntu: apt-get install g++ (or build-essential); or set CXX to a working compiler."
    "No matching distribution found|Could not find a version that satisfies"
    "pip found no suitable release in the indexes it was given (see 'Looking in indexes' in the log). Either the registry cannot be reached (check the network, HTTPS_PROXY, PIP_INDEX_URL), or it has no release for this Python and platform: Python 3.10-3.12 on Linux x86_64 is known to work (set PYTHON=python3.X, remove the venv and run again)."
    "Permission denied"
    "A file could not be written. Check the permissions of the venv folder and of pip's cache (~/.cache/pip)."
)

# Say what failed and why, then exit. For a known cause, print the log line that shows
# it and the fix; otherwise the log's tail.
fail() {
    local what="$1" i pattern line
    say "FAILED: $what"
    for ((i = 0; i < ${#KNOWN_FAILURES[@]}; i += 2)); do
        pattern="${KNOWN_FAILURES[i]}"
        line="$(tail -n "+$STEP_START" "$LOG" 2>/dev/null | grep -m1 -oE ".{0,100}($pattern).{0,80}" || true)"
        if [ -n "$line" ]; then
            line="$(sed -E 's/^[[:space:]]+//' <<<"$line")"
            say "cause, from the log: $line"
            say "fix: ${KNOWN_FAILURES[i + 1]}"
            say "full installer log: $LOG"
            exit 1
        fi
    done
    if [ -s "$LOG" ]; then
        printf '%s\n' "----- last lines of $LOG -----" >&2
        tail -n 25 "$LOG" >&2
        printf '%s\n' "-----" >&2
    fi
    say "full installer log: $LOG"
    exit 1
}

# Run an installer command with its output in the log; on failure, explain.
run_logged() {
    local what="$1" t0=$SECONDS
    shift
    say "$what ..."
    STEP_START=$(($(wc -l <"$LOG") + 1))
    printf '\n### %s (%s)\n$ %s\n' "$what" "$(date '+%F %T')" "$*" >>"$LOG"
    "$@" >>"$LOG" 2>&1 || fail "$what"
    say "  done in $((SECONDS - t0)) s"
}

pip_install() { run_logged "$1" "$PY" -m pip install "${@:2}"; }

have_compiler() {
    command -v "${CXX:-c++}" >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || command -v clang++ >/dev/null 2>&1
}

has_cuda_gpu() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# Print, one per line, what is missing from the environment: pip requirement names,
# or "build-tools", "openfold" and "project". Checks by importing.
missing() {
    local stamp_ok=0
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(install_key)" ] && [ -x "$VENV/bin/flashlight-fold" ]; then
        stamp_ok=1
    fi
    # -I: ignore PYTHONPATH and the current directory, so only installed code counts.
    "$PY" -I - "$ROOT" "$stamp_ok" "$SETUP_RELAX" <<'PYEOF'
import importlib, importlib.util, os, sys

root, stamp_ok, relax = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"


def importable(name):
    try:
        importlib.import_module(name)
        return True
    except Exception:
        return False


def present(name):
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False


def build_tools_ok():
    try:
        import setuptools
        import wheel  # noqa: F401
    except Exception:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 64


out = []
if not build_tools_ok():
    out.append("build-tools")
torch_ok = importable("torch")
if not torch_ok:
    out.append("torch")
for module, requirement in [
    ("triton", "triton"),
    ("numpy", "numpy"),
    ("Bio", "biopython"),
    ("ml_collections", "ml-collections"),
    ("tree", "dm-tree"),
    ("scipy", "scipy"),
    ("tqdm", "tqdm"),
    ("matplotlib", "matplotlib"),
    ("pytest", "pytest"),
    ("xdist", "pytest-xdist"),
    ("hypothesis", "hypothesis"),
    ("modelcif", "modelcif"),
    ("gemmi", "gemmi"),
] + ([("openmm", "openmm"), ("pdbfixer", "pdbfixer")] if relax else []):
    if not present(module):
        out.append(requirement)
if not (torch_ok and importable("attn_core_inplace_cuda") and importable("openfold.config")):
    out.append("openfold")


def under(module, folder):
    path = getattr(sys.modules.get(module), "__file__", None) or ""
    return os.path.realpath(path).startswith(os.path.realpath(os.path.join(root, folder)) + os.sep)


project_ok = (
    stamp_ok
    and torch_ok
    and importable("flashlight.integrations")
    and importable("flashlight.structures")
    and under("flashlight", "flashlight")
    and under("flashlight.integrations", "integrations")
    and under("flashlight.structures", "structures")
)
if not project_ok:
    out.append("project")
print("\n".join(out))
PYEOF
}

# Changes to the packaging files call for a new editable install (entry points, packages).
install_key() {
    cat "$ROOT/pyproject.toml" "$ROOT/setup.py" 2>/dev/null | cksum | cut -d' ' -f1
}

# openfold==0.0.1 is an sdist whose setup.py imports scripts.utils.get_nvidia_cc, a
# module the sdist does not contain. A stand-in on PYTHONPATH (in a temporary folder)
# lets it build against the torch already installed; without CUDA it compiles a CPU
# stub of its attn_core_inplace_cuda extension (see flashlight.integrations.openfold_compat).
build_openfold() {
    local shim
    shim="$(mktemp -d "${TMPDIR:-/tmp}/flashlight-openfold-shim.XXXXXX")"
    mkdir "$shim/scripts"
    : >"$shim/scripts/__init__.py"
    cat >"$shim/scripts/utils.py" <<'PYEOF'
"""Stand-in for OpenFold's scripts/utils.py: compute capability of the local GPU, if any."""
import subprocess


def get_nvidia_cc():
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout.split()
        major, minor = out[0].split(".")
        return (int(major), int(minor)), None
    except Exception:
        return None, None
PYEOF
    local extra=("$@")
    PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" pip_install "installing OpenFold ($OPENFOLD_SPEC, built from the registry's sdist unless pip has built it before)" \
        --no-build-isolation --no-deps ${extra[@]+"${extra[@]}"} "$OPENFOLD_SPEC"
    rm -rf "$shim"
}

# Only one setup at a time per checkout (e.g. tests and the example started together).
if command -v flock >/dev/null 2>&1; then
    exec 9<"${BASH_SOURCE[0]}"
    flock 9
fi

# 1. The virtual environment.
if [ ! -x "$PY" ] || ! "$PY" -c 'import sys' >/dev/null 2>&1; then
    if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] ; then
        say "FAILED: $VENV exists but is not a virtual environment. Move it away and run again."
        exit 1
    fi
    if [ -e "$VENV" ]; then
        say "FAILED: $VENV is a broken virtual environment (its python does not run: moved, or the interpreter was removed). Remove it (rm -rf '$VENV') and run again."
        exit 1
    fi
    BASE="${PYTHON:-python3}"
    if ! command -v "$BASE" >/dev/null 2>&1; then
        say "FAILED: no '$BASE' on PATH. Install Python 3.10 or newer (Debian/Ubuntu: apt-get install python3 python3-venv), or set PYTHON=/path/to/python3."
        exit 1
    fi
    if ! "$BASE" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
        say "FAILED: $BASE is Python $("$BASE" -c 'import sys; print(sys.version.split()[0])'); Flashlight needs 3.10 or newer. Set PYTHON=/path/to/python3.X."
        exit 1
    fi
    if ! "$BASE" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        say "FAILED: $BASE cannot create virtual environments (its venv/ensurepip modules are missing). Debian/Ubuntu: apt-get install python3-venv (or python3.X-venv matching '$BASE --version'), then run again."
        exit 1
    fi
    VENV_FLAGS=()
    if has_cuda_gpu; then
        # Keep the system's CUDA build of torch (and Triton) visible in the venv.
        VENV_FLAGS+=(--system-site-packages)
    fi
    run_logged "creating $VENV" "$BASE" -m venv ${VENV_FLAGS[@]+"${VENV_FLAGS[@]}"} "$VENV"
fi

# 2. What is missing?
MISSING="$(missing)" || fail "checking the environment with $PY"
if [ -z "$MISSING" ]; then
    rm -f "$LOG"
    say "environment ready ($VENV, checked in $((SECONDS - START)) s)"
    exit 0
fi
mv "$LOG" "$VENV/setup.log"
LOG="$VENV/setup.log"
say "missing: $(echo $MISSING)"
needs() { grep -qx "$1" <<<"$MISSING"; }

# 3. Install it, in dependency order.
if needs build-tools; then
    pip_install "installing build tools (setuptools, wheel)" "setuptools>=64" wheel
fi
if needs torch; then
    if has_cuda_gpu; then
        pip_install "installing torch (CUDA GPU found: pip's default build)" torch
    else
        pip_install "installing torch ($TORCH_CPU_SPEC, CPU build: no CUDA GPU found)" "$TORCH_CPU_SPEC"
    fi
fi
REQS=()
for req in triton numpy biopython ml-collections dm-tree scipy tqdm matplotlib pytest pytest-xdist hypothesis; do
    if needs "$req"; then REQS+=("$req"); fi
done
for pinned in "$MODELCIF_SPEC" "$GEMMI_SPEC" "$OPENMM_SPEC" "$PDBFIXER_SPEC"; do
    if needs "${pinned%%==*}"; then REQS+=("$pinned"); fi
done
if [ ${#REQS[@]} -gt 0 ]; then
    pip_install "installing ${REQS[*]}" "${REQS[@]}"
fi
if needs openfold; then
    build_openfold
    # A wheel reused from pip's cache may have been built against another torch:
    # if its extension does not load, rebuild from source.
    # (torch first: the extension links against torch's shared libraries)
    if ! "$PY" -I -c 'import torch, attn_core_inplace_cuda, openfold.config' >>"$LOG" 2>&1; then
        build_openfold --no-cache-dir --force-reinstall
        "$PY" -I -c 'import torch, attn_core_inplace_cuda, openfold.config' >>"$LOG" 2>&1 \
            || fail "importing OpenFold after building it"
    fi
fi
if needs project; then
    pip_install "installing this repository (editable) as the package flashlight" \
        --no-deps --no-build-isolation -e "$ROOT"
    install_key >"$STAMP"
fi

# 4. Check again: anything still missing is a failure, not a silent gap.
MISSING="$(missing)" || fail "checking the environment with $PY"
if [ -n "$MISSING" ]; then
    fail "still missing after installing: $(echo $MISSING)"
fi
say "environment ready ($VENV, set up in $((SECONDS - START)) s; installer log: $LOG)"
