#!/usr/bin/env bash
# Fold the bundled example proteins (setting up .venv first if anything is missing).
#
#   bash scripts/fold_example.sh              # writes out/example/<record>/...
#   bash scripts/fold_example.sh --params params_model_1.npz ...   # your own options
#
# The inputs are structures/examples/miniproteins.fasta (two short proteins) with the
# alignment in structures/examples/. Without --params, the model has seeded RANDOM
# weights: the coordinates are not a structure prediction, and the outputs say so.
#
# With no arguments, the options depend on the machine: with a CUDA GPU, the
# flashlight-fold defaults (Flashlight on); without one, stock OpenFold on the CPU.
# Either way each record is folded once, with its MSA at its own depth. Any arguments
# replace these options (the input files and --out-dir stay unless given again); see:
# .venv/bin/flashlight-fold --help
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

FOLD=.venv/bin/flashlight-fold
if [ ! -x "$FOLD" ]; then
    echo "fold_example: $FOLD is missing; run: bash scripts/setup.sh" >&2
    exit 1
fi

if [ $# -eq 0 ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        set --
    else
        echo "fold_example: no CUDA GPU: folding with stock OpenFold on the CPU" >&2
        set -- --no-flashlight
    fi
fi

exec "$FOLD" structures/examples/miniproteins.fasta \
    --alignment-dir structures/examples --out-dir out/example "$@"
