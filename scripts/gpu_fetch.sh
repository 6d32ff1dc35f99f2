#!/usr/bin/env bash
# Fetch everything the CUDA GPU machine lacks into .gpu/, on a machine that reaches
# the package registry. .gpu/ is ignored by git; it is carried with the working tree
# to the GPU machine, where scripts/gpu_run.sh installs it without any network.
#
#   bash scripts/gpu_fetch.sh              # required packages + optional peers
#   bash scripts/gpu_fetch.sh --no-peers   # only what Flashlight and OpenFold need
#   bash scripts/gpu_fetch.sh --no-cueq    # skip cuEquivariance (27 MB of the total)
#   bash scripts/gpu_fetch.sh --force      # fetch again even if files are present
#   bash scripts/gpu_fetch.sh --deepspeed  # also DeepSpeed (DS4Sci_EvoformerAttention), 12 MB
#   bash scripts/gpu_fetch.sh --flash      # also FlexAttention's FLASH backend, into .gpuflash/
#
# The GPU machine is assumed to run Python 3.12 on Linux x86_64 with torch, triton,
# numpy, scipy, matplotlib, tqdm, pytest and hypothesis preinstalled.
# What lands in .gpu/:
#   wheels/          cp312/py3 wheels Flashlight and OpenFold need (biopython,
#                    ml-collections, dm-tree and their own dependencies; modelcif,
#                    ihm and gemmi for flashlight-fold's mmCIF output and its tests)
#   sdist/           openfold-0.0.1.tar.gz (built on the GPU machine, with its CUDA
#                    extension, by gpu_run.sh)
#   peers/wheels/    trifast and its pure-Python dependencies
#   peers/cuequivariance-<ver>-cp312.tar.xz
#                    cuEquivariance's four wheels (+ opt-einsum, nvidia-ml-py)
#                    installed into one folder and packed (74 MB of wheels -> 27 MB)
#   peers/deepspeed/ (--deepspeed) the deepspeed-0.19.8 sdist, the nvidia-cutlass 4.2.0.0
#                    wheel (CUTLASS's headers, for the op's JIT build) and DeepSpeed's
#                    runtime dependencies (hjson, pydantic and its own, py-cpuinfo, ninja,
#                    msgpack, psutil); gpu_run.sh --deepspeed installs those it lacks
#   MANIFEST.sha256  checksums, verified on the GPU machine
#
# --flash: FlexAttention's FLASH backend needs flash-attn-4 and CuTeDSL, whose CUDA 13
# library wheel (nvidia-cutlass-dsl-libs-cu13) is 92 MB: more than travels with the
# working tree in one call (64 MiB), so it goes in two, beside .gpu/ rather than in it:
#   .gpuflash/a/     the small wheels (flash-attn-4, nvidia-cutlass-dsl, its -libs-base and
#                    -libs-core, quack-kernels, apache-tvm-ffi, torch-c-dlpack-ext; 10 MB)
#                    and the library wheel's first 44 MB, with the whole wheel's checksum
#   .gpuflash/b/     the rest of it (48 MB)
# Carry .gpu, .gpuflash/a and .gpuflash/b in three calls in a row, then
# "gpu_run.sh --flash" joins, checks and installs them (a carried folder stays on the
# GPU machine until it is handed back; bench/run_all.sh's kernels-flex-flash part).
#
# Environment:
#   PYTHON   interpreter used to run pip (default: the repo's .venv, else python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.gpu"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore PIP_PROGRESS_BAR=off

# Pinned versions: the same as the CPU development environment where they overlap.
REQUIRED=(
    biopython==1.88
    ml-collections==1.1.0
    dm-tree==0.1.10
    absl-py==2.5.1
    pyyaml==6.0.3
    wrapt==2.5.2
    attrs==26.1.0
    modelcif==1.8
    msgpack==1.2.4
    gemmi==0.7.5
)
# modelcif's dependency; the registry has only its sdist: built here without its
# optional C extension (a py3-none-any wheel; its pure-Python reader is used).
IHM_SPEC=ihm==2.12
TRIFAST=(
    trifast==0.1.13
    platformdirs==4.14.8
    einops==0.8.2
    jaxtyping==0.3.11
    wadler-lindig==0.1.8
)
CUEQ_VERSION=0.13.0
CUEQ=(
    cuequivariance==$CUEQ_VERSION
    cuequivariance-torch==$CUEQ_VERSION
    cuequivariance-ops-cu13==$CUEQ_VERSION
    cuequivariance-ops-torch-cu13==$CUEQ_VERSION
    opt-einsum==3.4.0
    nvidia-ml-py==13.615.71
)
OPENFOLD_SPEC=openfold==0.0.1
FLASH_WHEELS=(
    flash-attn-4==4.0.0b40
    nvidia-cutlass-dsl==4.8.1
    nvidia-cutlass-dsl-libs-base==4.8.1
    nvidia-cutlass-dsl-libs-core==4.8.1
    quack-kernels==0.6.5
    apache-tvm-ffi==0.1.15.post2
    torch-c-dlpack-ext==0.1.5
)
FLASH_LIBS=nvidia-cutlass-dsl-libs-cu13==4.8.1  # CUDA 13, as the GPU machine's torch
FLASH_PART_BYTES=44000000  # each call: its part (and the small wheels) and the tree under 64 MiB
DEEPSPEED_SPEC=deepspeed==0.19.8
DEEPSPEED_WHEELS=(
    nvidia-cutlass==4.2.0.0
    hjson==3.1.0
    pydantic==2.14.4
    pydantic-core==2.50.5
    annotated-types==0.8.0
    typing-extensions==4.16.0
    typing-inspection==0.4.5
    py-cpuinfo==9.0.0
    ninja==1.13.2
    msgpack==1.2.4
    psutil==7.2.2
)
# Wheels for the GPU machine's interpreter, whatever this machine runs.
TARGET_FLAGS=(
    --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
    --platform manylinux1_x86_64 --platform any
)

peers=1
cueq=1
force=0
deepspeed=0
flash=0
for arg in "$@"; do
    case "$arg" in
        --no-peers) peers=0 ;;
        --no-cueq) cueq=0 ;;
        --deepspeed) deepspeed=1 ;;
        --flash) flash=1 ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
        *) echo "gpu_fetch: unknown option $arg (see --help)" >&2; exit 2 ;;
    esac
done

say() { printf 'gpu_fetch: %s\n' "$*" >&2; }
LOG="$DEST/fetch.log"
mkdir -p "$DEST"
: >"$LOG"

run_logged() {
    local what="$1"; shift
    say "$what"
    printf '\n### %s\n$ %s\n' "$what" "$*" >>"$LOG"
    if ! "$@" >>"$LOG" 2>&1; then
        say "FAILED: $what. Last lines of $LOG:"
        tail -n 20 "$LOG" >&2
        exit 1
    fi
}

if [ "$force" = 1 ]; then
    say "--force: removing $DEST/wheels $DEST/sdist $DEST/peers"
    rm -rf "$DEST/wheels" "$DEST/sdist" "$DEST/peers"
fi
mkdir -p "$DEST/wheels" "$DEST/sdist"

download_wheels() {  # download_wheels DIR SPEC...
    local dir="$1"; shift
    mkdir -p "$dir"
    run_logged "downloading $* -> ${dir#"$ROOT"/}" \
        "$PYTHON" -m pip download --no-deps "${TARGET_FLAGS[@]}" -d "$dir" "$@"
}

# 1. Required wheels.
download_wheels "$DEST/wheels" "${REQUIRED[@]}"
if ! ls "$DEST"/wheels/ihm-*-py3-none-any.whl >/dev/null 2>&1; then
    run_logged "building $IHM_SPEC as a pure-Python wheel (its C extension is optional)" \
        "$PYTHON" -m pip wheel --no-deps --no-binary :all: -w "$DEST/wheels" \
        --config-settings=--build-option=--without-ext "$IHM_SPEC"
    # The build is tagged for this interpreter (cp311, say) even where its optional C
    # extension is left out or unused; ihm runs as pure Python without it, so the wheel
    # is retagged to install on the GPU machine's CPython 3.12 (a .so built for another
    # CPython is never imported there).
    for built in "$DEST"/wheels/ihm-*-cp*.whl; do
        [ -e "$built" ] || continue
        run_logged "retagging ${built##*/} as py3-none-any" \
            "$PYTHON" -m wheel tags --remove --python-tag py3 --abi-tag none --platform-tag any "$built"
    done
fi

# 2. The OpenFold sdist. Its setup.py imports scripts.utils (absent from the sdist) and
# torch.utils.cpp_extension while pip prepares metadata, so pip runs it with a
# stand-in for both on PYTHONPATH; only the sdist file is kept.
if ! ls "$DEST"/sdist/openfold-0.0.1.tar.gz >/dev/null 2>&1; then
    shim="$(mktemp -d "${TMPDIR:-/tmp}/gpu-fetch-shim.XXXXXX")"
    trap 'rm -rf "$shim"' EXIT
    mkdir -p "$shim/scripts"
    : >"$shim/scripts/__init__.py"
    printf 'def get_nvidia_cc():\n    return None, None\n' >"$shim/scripts/utils.py"
    if ! "$PYTHON" -c 'import torch.utils.cpp_extension' >/dev/null 2>&1; then
        mkdir -p "$shim/torch/utils"
        : >"$shim/torch/__init__.py"
        : >"$shim/torch/utils/__init__.py"
        cat >"$shim/torch/utils/cpp_extension.py" <<'PYEOF'
# Metadata-only stand-in: enough for openfold's setup.py to describe itself.
from setuptools import Extension as CppExtension, Extension as CUDAExtension
from setuptools.command.build_ext import build_ext as BuildExtension
CUDA_HOME = None
PYEOF
    fi
    if ! "$PYTHON" -c 'import setuptools
try:
    import setuptools.command.bdist_wheel
except ImportError:
    import wheel' >/dev/null 2>&1; then
        say "FAILED: $PYTHON lacks setuptools>=70.1 (or setuptools plus wheel), which pip needs to read the OpenFold sdist's metadata."
        say "Install them (\"$PYTHON -m pip install -U setuptools wheel\") or set PYTHON to an interpreter that has them (the repo's .venv does)."
        exit 1
    fi
    PYTHONPATH="$shim" run_logged "downloading the $OPENFOLD_SPEC sdist" \
        "$PYTHON" -m pip download --no-deps --no-binary :all: --no-build-isolation -d "$DEST/sdist" "$OPENFOLD_SPEC"
fi

# 3. Optional peers.
if [ "$peers" = 1 ]; then
    download_wheels "$DEST/peers/wheels" "${TRIFAST[@]}"
    if [ "$cueq" = 1 ]; then
        pack="$DEST/peers/cuequivariance-$CUEQ_VERSION-cp312.tar.xz"
        if [ ! -s "$pack" ]; then
            tmp="$(mktemp -d "${TMPDIR:-/tmp}/gpu-fetch-cueq.XXXXXX")"
            download_wheels "$tmp/wheels" "${CUEQ[@]}"
            run_logged "installing cuEquivariance into one folder (for Python 3.12)" \
                "$PYTHON" -m pip install --no-deps --no-index --no-compile "${TARGET_FLAGS[@]}" \
                --target "$tmp/site" "$tmp"/wheels/*.whl
            # Test-only files that the ops wheel installs next to its packages.
            rm -rf "$tmp/site/include" "$tmp/site/lib64" "$tmp/site/example.py" "$tmp/site/bin"
            say "packing $(du -sh "$tmp/site" | cut -f1) of cuEquivariance as tar.xz (about 1.5 min)"
            tar -C "$tmp/site" -cf - . | xz -9 -T0 >"$pack.part"
            mv "$pack.part" "$pack"
            rm -rf "$tmp"
        fi
    fi
fi

# 3b. DeepSpeed (optional): its sdist (installed with DS_BUILD_OPS=0 on the GPU machine,
# which JIT-builds DS4Sci_EvoformerAttention's op there) and the wheels it needs.
if [ "$peers" = 1 ] && [ "$deepspeed" = 1 ]; then
    ds="$DEST/peers/deepspeed"
    download_wheels "$ds" "${DEEPSPEED_WHEELS[@]}"
    if ! ls "$ds"/deepspeed-*.tar.gz >/dev/null 2>&1; then
        run_logged "downloading the $DEEPSPEED_SPEC sdist" \
            "$PYTHON" -m pip download --no-deps --no-binary :all: --no-build-isolation -d "$ds" "$DEEPSPEED_SPEC"
    fi
    say "DeepSpeed: $(du -sh "$ds" | cut -f1) in ${ds#"$ROOT"/}"
fi

# 3c. FlexAttention's FLASH backend (optional), in .gpuflash/ (see the top of this file).
if [ "$flash" = 1 ]; then
    FLASH="$ROOT/.gpuflash"
    [ "$force" = 1 ] && rm -rf "$FLASH"
    if [ ! -s "$FLASH/a/libs.sha256" ]; then
        tmp="$(mktemp -d "${TMPDIR:-/tmp}/gpu-fetch-flash.XXXXXX")"
        download_wheels "$FLASH/a/wheels" "${FLASH_WHEELS[@]}"
        download_wheels "$tmp" "$FLASH_LIBS"
        libs="$(ls "$tmp"/*.whl)"
        (cd "$tmp" && sha256sum "$(basename "$libs")") >"$tmp/libs.sha256"
        split -b "$FLASH_PART_BYTES" -d -a 1 "$libs" "$tmp/libs.part"
        [ ! -e "$tmp/libs.part2" ] || { say "FAILED: the library wheel needs more than two parts"; exit 1; }
        mkdir -p "$FLASH/b"
        mv "$tmp/libs.part0" "$FLASH/a/" && mv "$tmp/libs.part1" "$FLASH/b/" && mv "$tmp/libs.sha256" "$FLASH/a/"
        rm -rf "$tmp"
    fi
    say "FLASH backend: $(du -sh "$FLASH/a" | cut -f1) in .gpuflash/a, $(du -sh "$FLASH/b" | cut -f1) in .gpuflash/b"
fi

# 4. Every wheel must suit CPython 3.12 on Linux x86_64.
"$PYTHON" - "$DEST" $( [ "$flash" = 1 ] && echo "$ROOT/.gpuflash" ) <<'PYEOF'
import pathlib, sys
bad = []
for whl in [w for root in sys.argv[1:] for w in pathlib.Path(root).rglob("*.whl")]:
    parts = whl.name[:-4].split("-")
    py, abi, plat = parts[-3], parts[-2], parts[-1]
    py_ok = any(t in ("cp312", "py3", "py312") for t in py.split(".")) or (
        abi == "abi3" and any(t.startswith("cp3") and int(t[3:] or 99) <= 12 for t in py.split(".")))
    abi_ok = any(t in ("cp312", "abi3", "none") for t in abi.split("."))
    plat_ok = all(t == "any" or (t.startswith("manylinux") and t.endswith("x86_64")) for t in plat.split("."))
    if not (py_ok and abi_ok and plat_ok):
        bad.append(whl.name)
if bad:
    sys.exit("gpu_fetch: wheels that do not suit CPython 3.12 on Linux x86_64: " + ", ".join(bad))
PYEOF

# 5. Checksums, verified on the GPU machine.
(cd "$DEST" && find wheels sdist peers -type f 2>/dev/null | LC_ALL=C sort | xargs sha256sum >MANIFEST.sha256)
say "done: $(du -sh "$DEST" | cut -f1) in $DEST"
(cd "$DEST" && du -ah wheels sdist peers 2>/dev/null | grep -v '/$' | sort -k2) >&2
