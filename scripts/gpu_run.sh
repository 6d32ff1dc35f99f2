#!/usr/bin/env bash
# Prepare the CUDA GPU machine from files carried with the working tree, then run a
# command there. The GPU machine has Python 3.12, torch, triton, numpy, scipy,
# matplotlib, tqdm, pytest and hypothesis, and no network; everything else comes from
# .gpu/ (made by scripts/gpu_fetch.sh on a machine that reaches the package registry).
#
#   scripts/gpu_run.sh [options] -- COMMAND [ARGS...]
#
# Run from anywhere; COMMAND runs in the repository root. Examples:
#   scripts/gpu_run.sh -- python3 -m pytest -q tests
#   scripts/gpu_run.sh --no-openfold -- python3 -m bench.kernels --variants vanilla
#   scripts/gpu_run.sh --collect /some/dir -- bash bench/run_all.sh
#
# Options:
#   --no-openfold    do not build OpenFold (kernel benchmarks and tests do not need it)
#   --openfold-bg    build OpenFold in the background while COMMAND runs; whatever
#                    needs it waits for it (bench/evoformer.py does), and this script
#                    waits for the build before it exits
#   --no-peers       do not install the optional peers (trifast, cuEquivariance)
#   --collect DIR    afterwards, copy bench/results/ (results and logs) into DIR
#   --deepspeed      also install DeepSpeed from .gpu/peers/deepspeed (gpu_fetch.sh
#                    --deepspeed) with DS_BUILD_OPS=0 into $FLASHLIGHT_GPU_SITE-deepspeed
#                    (off PYTHONPATH, named by FLASHLIGHT_DEEPSPEED_SITE), and set what its JIT build of
#                    DS4Sci_EvoformerAttention needs: CUTLASS_PATH (the nvidia-cutlass
#                    wheel's headers), TORCH_CUDA_ARCH_LIST (the GPU's), MAX_JOBS,
#                    TORCH_EXTENSIONS_DIR ($FLASHLIGHT_GPU_SITE/torch_extensions, kept
#                    while the machine is) and ninja on PATH; a prebuilt op carried as
#                    .gpu/peers/deepspeed/prebuilt.tar.xz.part* is unpacked there (bench/ds4sci.py)
#   --flash          also install FlexAttention's FLASH backend (flash-attn-4, CuTeDSL) from
#                    .gpuflash/a and .gpuflash/b (gpu_fetch.sh --flash; too large for one
#                    call, they are carried in calls of their own before this one and stay
#                    on the machine): the library wheel's halves joined and checked, all
#                    installed into $FLASHLIGHT_GPU_SITE-flash, which goes on PYTHONPATH
#   -h, --help       this text
#
# What it does, each step skipped when already done (safe to run again and again on
# the same machine):
#   1. checks .gpu/ against its checksums;
#   2. installs the wheels in .gpu/wheels (and .gpu/peers) that the interpreter does
#      not already have into $FLASHLIGHT_GPU_SITE (default /tmp/site), with no network;
#   3. unpacks cuEquivariance into the same folder;
#   4. builds openfold==0.0.1 from .gpu/sdist with its CUDA extension for this GPU
#      (about 2 minutes, once per machine);
#   5. makes "import flashlight" see this working tree, with flashlight.integrations
#      and flashlight.structures mapped as pyproject.toml says (an import finder in
#      $FLASHLIGHT_GPU_SITE-boot/sitecustomize.py when nothing installed provides it);
#   6. runs COMMAND with PYTHONPATH set, its output also in bench/results/logs/.
# Exit status: COMMAND's; 10-19 when preparing the machine failed (message says why).
#
# Environment:
#   PYTHON                  interpreter (default: python3)
#   FLASHLIGHT_GPU_SITE     install folder (default: /tmp/site)
#   FLASHLIGHT_GPU_FILES    the carried files (default: <repo>/.gpu)
#   FLASHLIGHT_OPENFOLD_CC  compute capability to build OpenFold for, e.g. 9.0
#                           (default: the GPU's, else 9.0)
#   OUT                     a folder that comes back from the GPU machine, if any; passed
#                           on as FLASHLIGHT_GPU_OUT (bench/ds4sci.py packs its build there)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 10
export FLASHLIGHT_GPU_RUN_START="${FLASHLIGHT_GPU_RUN_START:-$(date +%s)}"
PY="${PYTHON:-python3}"
SITE="${FLASHLIGHT_GPU_SITE:-/tmp/site}"
DS_SITE="$SITE-deepspeed"  # --deepspeed: DeepSpeed and its dependencies, off PYTHONPATH
FILES="${FLASHLIGHT_GPU_FILES:-$ROOT/.gpu}"
BOOT="$SITE-boot"
LOGDIR="$ROOT/bench/results/logs"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
PREP_LOG="$LOGDIR/$STAMP-prepare.log"
CMD_LOG="$LOGDIR/$STAMP-command.log"
OPENFOLD_LOG="$LOGDIR/$STAMP-openfold-build.log"
OPENFOLD_STATUS="$SITE/.openfold-status"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore PIP_PROGRESS_BAR=off PIP_NO_INDEX=1

openfold=fg
peers=1
deepspeed=0
flash=0
collect=""
while [ $# -gt 0 ]; do
    case "$1" in
        --no-openfold) openfold=no ;;
        --openfold-bg) openfold=bg ;;
        --no-peers) peers=0 ;;
        --deepspeed) deepspeed=1 ;;
        --flash) flash=1 ;;
        --collect) collect="${2:?--collect needs a folder}"; shift ;;
        --collect=*) collect="${1#--collect=}" ;;
        -h|--help) sed -n '2,56p' "$0"; exit 0 ;;
        --) shift; break ;;
        -*) echo "gpu_run: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
if [ $# -eq 0 ]; then
    echo "gpu_run: no command given; usage: scripts/gpu_run.sh [options] -- COMMAND [ARGS...]" >&2
    exit 2
fi

mkdir -p "$LOGDIR" "$SITE"
: >"$PREP_LOG"
elapsed() { echo $(( $(date +%s) - FLASHLIGHT_GPU_RUN_START )); }
say() { printf '[gpu_run %4ss] %s\n' "$(elapsed)" "$*" | tee -a "$PREP_LOG" >&2; }
die() {  # die STATUS MESSAGE...
    local status="$1"; shift
    say "FAILED: $*"
    say "preparation log: ${PREP_LOG#"$ROOT"/}"
    collect_results
    exit "$status"
}
collect_results() {
    [ -n "$collect" ] || return 0
    mkdir -p "$collect" && cp -r "$ROOT/bench/results" "$collect/" \
        && say "copied bench/results/ (results and logs) into $collect/results" \
        || say "WARNING: could not copy bench/results/ into $collect"
}
logged() {  # logged LOGFILE COMMAND... : run, output appended to LOGFILE
    local log="$1"; shift
    printf '\n$ %s\n' "$*" >>"$log"
    "$@" >>"$log" 2>&1
}

# ---------------------------------------------------------------- 0. the machine
say "repository $ROOT; installs into $SITE; logs in ${LOGDIR#"$ROOT"/}/$STAMP-*"
"$PY" - >>"$PREP_LOG" 2>&1 <<'PYEOF'
import sys
print("python", sys.version.split()[0], sys.executable)
try:
    import torch, triton
    print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print("gpu", p.name, f"{p.total_memory / 2**30:.1f} GiB", "cc", f"{p.major}.{p.minor}")
    else:
        print("gpu none visible to torch")
except Exception as e:  # reported, not fatal here
    print("torch/triton import failed:", e)
PYEOF
grep -E '^(python|torch|gpu)' "$PREP_LOG" | sed 's/^/    /' >&2
command -v nvidia-smi >/dev/null 2>&1 \
    && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$PREP_LOG" 2>&1
PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" || die 10 "$PY does not run"
[ "$PYVER" = 3.12 ] || say "WARNING: Python $PYVER; the carried wheels are for CPython 3.12"

# ---------------------------------------------------------------- 1. carried files
if [ ! -f "$FILES/MANIFEST.sha256" ]; then
    die 11 "$FILES/MANIFEST.sha256 is missing. On a machine that reaches the package registry run 'bash scripts/gpu_fetch.sh', then carry .gpu/ with the working tree."
fi
if ! (cd "$FILES" && sha256sum --quiet -c MANIFEST.sha256) >>"$PREP_LOG" 2>&1; then
    die 11 "files in $FILES do not match MANIFEST.sha256 (incomplete copy?); run 'bash scripts/gpu_fetch.sh --force' again and carry .gpu/"
fi
say "carried files OK ($(du -sh "$FILES" | cut -f1))"

# ---------------------------------------------------------------- 2. wheels
# Prints the wheels in the given folders whose distribution is not installed yet
# (neither in the interpreter's own site-packages nor in $SITE).
missing_wheels() {
    PYTHONPATH="$SITE" "$PY" - "$@" <<'PYEOF'
import importlib.metadata as md, pathlib, re, sys
for folder in sys.argv[1:]:
    for whl in sorted(pathlib.Path(folder).glob("*.whl")):
        name = re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower()
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            print(whl)
PYEOF
}
install_wheels() {  # install_wheels WHAT FOLDER...
    local what="$1"; shift
    local todo
    todo="$(missing_wheels "$@")" || die 12 "could not inspect installed packages"
    if [ -z "$todo" ]; then
        say "$what: already installed"
        return 0
    fi
    say "$what: installing $(echo "$todo" | xargs -n1 basename | sed 's/-[0-9].*//' | tr '\n' ' ')"
    if [ "$have_pip" = 1 ]; then
        # shellcheck disable=SC2086
        logged "$PREP_LOG" "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $todo \
            || die 12 "pip could not install the wheels of $what (see the log)"
    else
        # shellcheck disable=SC2086
        logged "$PREP_LOG" "$PY" - "$SITE" $todo <<'PYEOF' || die 12 "could not unpack the wheels of $what (see the log)"
# No pip: unpack each wheel as pip --target would (package files and .data/purelib|platlib).
import pathlib, shutil, sys, zipfile
site = pathlib.Path(sys.argv[1])
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            parts = name.split("/")
            if name.endswith("/"):
                continue
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                dest = site.joinpath(*parts[2:])
            else:
                dest = site / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(name) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
    print("unpacked", whl)
PYEOF
    fi
}
have_pip=1
if ! "$PY" -m pip --version >>"$PREP_LOG" 2>&1; then
    have_pip=0
    say "WARNING: $PY has no pip; wheels are unpacked directly and OpenFold is built with setup.py"
fi
install_wheels "required packages" "$FILES/wheels"

# ---------------------------------------------------------------- 3. peers
if [ "$peers" = 1 ]; then
    if [ -d "$FILES/peers/wheels" ]; then
        install_wheels "trifast" "$FILES/peers/wheels"
    else
        say "trifast: not carried (run gpu_fetch.sh without --no-peers); skipped"
    fi
    pack="$(ls "$FILES"/peers/cuequivariance-*.tar.xz 2>/dev/null | head -n 1)"
    if PYTHONPATH="$SITE" "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("cuequivariance_ops_torch") is None)' 2>/dev/null; then
        say "cuEquivariance: already installed"
    elif [ -n "$pack" ]; then
        say "cuEquivariance: unpacking $(basename "$pack")"
        logged "$PREP_LOG" tar -C "$SITE" -xJf "$pack" || die 13 "could not unpack $pack"
    else
        say "cuEquivariance: not carried (run gpu_fetch.sh without --no-cueq); skipped"
    fi
fi

# DeepSpeed (optional): the sdist installed without building any op (DS_BUILD_OPS=0);
# DS4Sci_EvoformerAttention's op is JIT-built by bench/ds4sci.py into TORCH_EXTENSIONS_DIR.
if [ "$peers" = 1 ] && [ "$deepspeed" = 1 ]; then
    ds="$FILES/peers/deepspeed"
    if [ ! -d "$ds" ]; then
        say "DeepSpeed: not carried (run gpu_fetch.sh --deepspeed); skipped"
    else
        # A folder of its own, off PYTHONPATH: OpenFold 0.0.1 imports DeepSpeed whenever it
        # is importable and calls an API (deepspeed.utils.is_initialized) this release
        # lacks, so bench/ds4sci.py adds the folder to sys.path only after OpenFold decided.
        main_site="$SITE"; SITE="$DS_SITE"; mkdir -p "$SITE"
        install_wheels "DeepSpeed's dependencies" "$ds"
        SITE="$main_site"
        export PATH="$DS_SITE/bin:$PATH" FLASHLIGHT_DEEPSPEED_SITE="$DS_SITE"
        if PYTHONPATH="$SITE:$DS_SITE" "$PY" -c 'import deepspeed' >/dev/null 2>&1; then
            say "DeepSpeed: already installed"
        else
            sdist="$(ls "$ds"/deepspeed-*.tar.gz 2>/dev/null | head -n 1)"
            [ -n "$sdist" ] || die 13 "no deepspeed sdist in $ds"
            [ "$have_pip" = 1 ] || die 13 "installing DeepSpeed from its sdist needs pip"
            say "DeepSpeed: installing $(basename "$sdist") (DS_BUILD_OPS=0) into $DS_SITE"
            DS_BUILD_OPS=0 PYTHONPATH="$SITE:$DS_SITE" logged "$PREP_LOG" "$PY" -m pip install -q --no-index --no-deps \
                --no-build-isolation --no-compile --target "$DS_SITE" "$sdist" \
                || die 13 "DeepSpeed did not install from $sdist (see the log)"
        fi
        export CUTLASS_PATH=DS_USE_CUTLASS_PYTHON_BINDINGS MAX_JOBS="${MAX_JOBS:-$(nproc)}"
        export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$SITE/torch_extensions}"
        cc="$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))' 2>/dev/null || echo 9.0)"
        # letter suffixes (9.0a), which DeepSpeed's builder cannot read, are dropped by
        # bench/ds4sci.py for the build and for each process that loads the op
        export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$cc}"
        mkdir -p "$TORCH_EXTENSIONS_DIR"
        if ls "$ds"/prebuilt.tar.xz.part* >/dev/null 2>&1 && ! ls "$TORCH_EXTENSIONS_DIR"/*/evoformer_attn/*.so >/dev/null 2>&1; then
            # the build folder of an earlier machine. Ninja rebuilds a product whose mtime
            # recorded in .ninja_log is older than any of its inputs (the sources and
            # CUTLASS headers were just installed: they get a date before any build), or
            # whose mtime on disk is later than the one in .ninja_deps (recorded in ns, and
            # the tar keeps less: each product's mtime is cut to whole seconds)
            root="$("$PY" -c 'from torch.utils.cpp_extension import _get_build_directory as g; import os; print(os.path.dirname(g("evoformer_attn", False)))')"
            cat "$ds"/prebuilt.tar.xz.part* | xz -d | tar -C "$root" -xf - \
                && find "$DS_SITE" -exec touch -h -d 2000-01-01 {} + \
                && find "$root/evoformer_attn" -type f -exec sh -c 'for f; do touch -d "@$(stat -c %Y "$f")" "$f"; done' sh {} + \
                && say "DeepSpeed: unpacked the prebuilt DS4Sci op into $root" \
                || say "WARNING: could not unpack $ds/prebuilt.tar.xz.part*; the op is built again"
        fi
        say "DeepSpeed: TORCH_EXTENSIONS_DIR=$TORCH_EXTENSIONS_DIR, TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
    fi
fi
# FlexAttention's FLASH backend (optional): flash-attn-4 and CuTeDSL, off the main folder.
# CuTeDSL's own .pth (which puts its dsl_packages folder on sys.path) is not read from a
# PYTHONPATH folder, so that folder is named too.
FLASH_PATHS=""
if [ "$flash" = 1 ]; then
    FLASH_FILES="${FLASHLIGHT_GPU_FLASH_FILES:-$ROOT/.gpuflash}"
    FLASH_SITE="$SITE-flash"
    flash_paths="$FLASH_SITE:$FLASH_SITE/nvidia_cutlass_dsl/dsl_packages"
    if [ -d "$FLASH_SITE/flash_attn/cute" ]; then
        say "FLASH backend: already installed"
    elif [ ! -s "$FLASH_FILES/a/libs.sha256" ] || [ ! -s "$FLASH_FILES/a/libs.part0" ] || [ ! -s "$FLASH_FILES/b/libs.part1" ]; then
        say "FLASH backend: not carried in full (.gpuflash/a: $(ls "$FLASH_FILES/a" 2>/dev/null | tr '\n' ' ')," \
            ".gpuflash/b: $(ls "$FLASH_FILES/b" 2>/dev/null | tr '\n' ' ')); skipped. Carry .gpuflash/a, then" \
            ".gpuflash/b, each in a call of its own, then call with --flash"
    else
        joined="$FLASH_SITE-wheels"
        mkdir -p "$joined"
        name="$(awk '{print $2}' "$FLASH_FILES/a/libs.sha256")"
        cat "$FLASH_FILES/a/libs.part0" "$FLASH_FILES/b/libs.part1" >"$joined/$name" \
            && cp "$FLASH_FILES/a/libs.sha256" "$joined/" \
            && (cd "$joined" && sha256sum --quiet -c libs.sha256) >>"$PREP_LOG" 2>&1 \
            || die 14 "the FLASH backend's library wheel did not join to its checksum (carry .gpuflash/a and .gpuflash/b again)"
        [ "$have_pip" = 1 ] || die 14 "installing the FLASH backend needs pip"
        say "FLASH backend: installing $(ls "$FLASH_FILES/a/wheels" | sed 's/-[0-9].*//' | tr '\n' ' ')and $name into $FLASH_SITE"
        logged "$PREP_LOG" "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$FLASH_SITE" \
            "$FLASH_FILES"/a/wheels/*.whl "$joined/$name" \
            || die 14 "pip could not install the FLASH backend's wheels (see the log)"
        rm -f "$joined/$name"
    fi
    [ -d "$FLASH_SITE/flash_attn/cute" ] && FLASH_PATHS="$flash_paths"
fi

[ -n "${OUT:-}" ] && export FLASHLIGHT_GPU_OUT="$OUT"

# cuEquivariance's ops library loads CUDA's runtime compiler (libnvrtc) by name; with a
# pip-installed CUDA (torch's nvidia-* dependencies) it is not on the loader's path.
nvidia_libs="$("$PY" - <<'PYEOF' 2>/dev/null
import glob, os, site, sys
roots = [p for p in sys.path if p] + site.getsitepackages()
dirs = sorted({os.path.dirname(f) for r in roots for f in glob.glob(os.path.join(r, "nvidia", "**", "libnvrtc*.so*"), recursive=True)})
print(":".join(dirs))
PYEOF
)"
if [ -n "$nvidia_libs" ]; then
    export LD_LIBRARY_PATH="$nvidia_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "LD_LIBRARY_PATH += $nvidia_libs" >>"$PREP_LOG"
fi

# ---------------------------------------------------------------- 4. the flashlight namespace
# pyproject.toml maps integrations/ and structures/ into the flashlight package, which an
# installed package (or an editable install's finder) provides. When the plain tree does
# not, a sitecustomize module in $BOOT (first on PYTHONPATH) adds an import finder with
# the same mapping onto this working tree, then runs any other sitecustomize the
# interpreter has. Nothing is installed into the interpreter's own folders.
export PYTHONPATH="$SITE:$ROOT${FLASH_PATHS:+:$FLASH_PATHS}${PYTHONPATH:+:$PYTHONPATH}"
flashlight_ok() { "$PY" -c 'import flashlight, flashlight.integrations' >>"$PREP_LOG" 2>&1; }
if flashlight_ok; then
    say "flashlight: importable from the working tree"
else
    rm -rf "$BOOT"
    mkdir -p "$BOOT"
    "$PY" - "$ROOT" "$BOOT/sitecustomize.py" >>"$PREP_LOG" 2>&1 <<'PYEOF' || die 14 "could not write the flashlight import finder"
import pathlib, sys, tomllib
root, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
mapping = {pkg: str((root / folder).resolve()) for pkg, folder in mapping.items()
           if (root / folder).resolve() != root.joinpath(*pkg.split(".")).resolve()}
target.write_text(f'''"""Written by scripts/gpu_run.sh: maps packages onto folders of {root}
as pyproject.toml's package-dir does (an editable install's job), then runs the next
sitecustomize module on sys.path, if any."""
import importlib.abc
import importlib.util
import os
import sys

_MAPPING = {mapping!r}


class _PackageDirFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        folder = _MAPPING.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])


sys.meta_path.insert(0, _PackageDirFinder())

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    _candidate = os.path.join(os.path.abspath(_entry or "."), "sitecustomize.py")
    if os.path.dirname(_candidate) != _here and os.path.isfile(_candidate):
        with open(_candidate) as _f:
            exec(compile(_f.read(), _candidate, "exec"), {{"__name__": "sitecustomize", "__file__": _candidate}})
        break
''')
print("import finder:", mapping)
PYEOF
    export PYTHONPATH="$BOOT:$PYTHONPATH"
    flashlight_ok || die 14 "'import flashlight.integrations' fails even with the import finder (see the log)"
    say "flashlight: importable, integrations/ and structures/ mapped by $BOOT/sitecustomize.py"
fi

# ---------------------------------------------------------------- 5. OpenFold
openfold_ready() {
    [ "$(cat "$OPENFOLD_STATUS" 2>/dev/null)" = ok ] \
        && "$PY" -c 'import torch, attn_core_inplace_cuda, openfold.model.model' >/dev/null 2>&1
}
build_openfold() {  # runs in the foreground or in a background subshell
    local sdist build cc
    echo building >"$OPENFOLD_STATUS"
    sdist="$(ls "$FILES"/sdist/openfold-*.tar.gz 2>/dev/null | head -n 1)"
    [ -n "$sdist" ] || { echo "no openfold sdist in $FILES/sdist" >>"$OPENFOLD_LOG"; echo failed >"$OPENFOLD_STATUS"; return 1; }
    build="$(mktemp -d /tmp/openfold-build.XXXXXX)"
    (
        set -e
        tar -C "$build" -xzf "$sdist"
        cd "$build"/openfold-*
        # setup.py imports scripts.utils.get_nvidia_cc, which the sdist lacks.
        mkdir -p scripts
        : >scripts/__init__.py
        cat >scripts/utils.py <<'PYEOF'
"""Stand-in for OpenFold's scripts/utils.py: the compute capability to build for."""
import os


def get_nvidia_cc():
    forced = os.environ.get("FLASHLIGHT_OPENFOLD_CC")
    if forced:
        major, minor = forced.split(".")
        return (int(major), int(minor)), None
    try:
        import torch
        if torch.cuda.is_available():
            return tuple(torch.cuda.get_device_capability(0)), None
    except Exception:
        pass
    return (9, 0), None
PYEOF
        # torch >= 2.6 headers need C++17.
        sed -i "s/'-std=c++14'/'-std=c++17'/" setup.py
        grep -q "'-std=c++17'" setup.py
        cc="$("$PY" -c 'import sys; sys.path.insert(0, "."); from scripts.utils import get_nvidia_cc; print("%d.%d" % get_nvidia_cc()[0])')"
        echo "building for compute capability $cc; CUDA_HOME=$("$PY" -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME)')"
        if [ "$have_pip" = 1 ]; then
            TORCH_CUDA_ARCH_LIST="$cc" MAX_JOBS="$(nproc)" PYTHONPATH="" \
                "$PY" -m pip install --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" .
        else
            TORCH_CUDA_ARCH_LIST="$cc" MAX_JOBS="$(nproc)" PYTHONPATH="" \
                "$PY" setup.py build_ext --build-lib "$SITE"
            rm -rf "$SITE/openfold"
            cp -r openfold "$SITE/openfold"
        fi
        "$PY" -c 'import torch, attn_core_inplace_cuda, openfold.model.model; print("openfold imports")'
    ) >>"$OPENFOLD_LOG" 2>&1
    local status=$?
    rm -rf "$build"
    if [ $status -eq 0 ]; then echo ok >"$OPENFOLD_STATUS"; else echo failed >"$OPENFOLD_STATUS"; fi
    return $status
}
openfold_pid=""
if [ "$openfold" = no ]; then
    say "OpenFold: skipped (--no-openfold)"
elif openfold_ready; then
    say "OpenFold: already built"
else
    if ! "$PY" -c 'from torch.utils.cpp_extension import CUDA_HOME; import sys; sys.exit(CUDA_HOME is None)' 2>/dev/null; then
        say "WARNING: torch finds no CUDA toolkit (nvcc); OpenFold will build only its CPU stub"
    fi
    : >"$OPENFOLD_LOG"
    if [ "$openfold" = bg ]; then
        build_openfold &
        openfold_pid=$!
        echo "$openfold_pid" >"$SITE/.openfold-build.pid"
        say "OpenFold: building in the background (pid $openfold_pid, about 2 min; log ${OPENFOLD_LOG#"$ROOT"/})"
    else
        say "OpenFold: building from the sdist with its CUDA extension (about 2 min; log ${OPENFOLD_LOG#"$ROOT"/})"
        if build_openfold; then
            say "OpenFold: built"
        else
            tail -n 25 "$OPENFOLD_LOG" >&2
            die 15 "OpenFold did not build (log ${OPENFOLD_LOG#"$ROOT"/})"
        fi
    fi
fi
export FLASHLIGHT_OPENFOLD_STATUS="$OPENFOLD_STATUS" FLASHLIGHT_GPU_LOG_DIR="$LOGDIR" FLASHLIGHT_GPU_SITE="$SITE"

# ---------------------------------------------------------------- 6. the command
say "prepared; running: $* (output also in ${CMD_LOG#"$ROOT"/})"
"$@" 2>&1 | tee "$CMD_LOG"
status=${PIPESTATUS[0]}
say "command exited with status $status"
if [ -n "$openfold_pid" ] && kill -0 "$openfold_pid" 2>/dev/null; then
    say "waiting for the OpenFold build to finish"
fi
if [ -n "$openfold_pid" ]; then
    if wait "$openfold_pid"; then say "OpenFold: built"; else say "WARNING: OpenFold build failed (log ${OPENFOLD_LOG#"$ROOT"/})"; fi
fi
collect_results
exit "$status"
