#!/usr/bin/env bash
# Reproduce every benchmark result on the CUDA GPU machine, in calls of at most ten
# minutes. Each call runs the parts below in order, skipping those already complete,
# and stops cleanly before its time is up; run the same command again to continue.
#
#   scripts/gpu_run.sh --openfold-bg -- bash bench/run_all.sh   # on the GPU machine
#   bash bench/run_all.sh --list                               # parts and their state
#   bash bench/run_all.sh PART...                              # only these parts, in this order
#
# Progress lives in the result files themselves (bench/results/*.json: a part resumes
# where it stopped) and in bench/results/run_all.done (parts finished). Bring
# bench/results/ back from the GPU machine after each call, so the next call sees it.
# When every part is done it prints "ALL PARTS COMPLETE". It ends with a short table
# of the results so far; bench/report.py turns them into plots and the README section.
#
# Environment:
#   FLASHLIGHT_RUN_LIMIT_S   seconds one call may use, counted from the start of
#                            scripts/gpu_run.sh (default 570)
#   PYTHON                   interpreter (default python3)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PY="${PYTHON:-python3}"
START="${FLASHLIGHT_GPU_RUN_START:-$(date +%s)}"
LIMIT_S="${FLASHLIGHT_RUN_LIMIT_S:-570}"
export FLASHLIGHT_BUDGET_END=$((START + LIMIT_S))
DONE=bench/results/run_all.done
R=bench/results
mkdir -p "$R"


K="$PY -m bench.kernels --max-minutes 9"
E="$PY -m bench.evoformer --max-minutes 9"
# name | command. Ordered by what matters most if GPU time runs short: the tuned choices
# shipped for the kernels a fold compiles (its first call compiles them in the background
# only where a choice is known; the part writes flashlight/data/tuned_configs.json: bring
# that file back too), a user's second
# run of a small record (stock, the default command and FLASHLIGHT_PRELOAD=0 in fresh
# processes with the caches filled), the product path
# of the fold-speed claims (flashlight-fold --compare, cold and warm caches), the variants
# of bench/variants_general.py (several outputs, rotary, a relative-position table, global
# column attention) against their peers, the shipped tuned choices, the like-for-like
# attention core, the README's headline kernel cases with Flashlight and its peers in one
# run (the summary sets times from one run against each other), the masks that read values
# along the keys after the vector scan of tile liveness (newer than the headline cells, which
# the report then replaces), DeepSpeed's DS4Sci (its
# op's build is a part of its own: about 9 minutes), then the rest; below them, the parts
# measured before (done).
# The two launcher-beside-ab parts fold the same records from empty caches with the
# launchers built after each compile (Triton's way, the default) and beside it, one after
# the other on one machine ([Note: the launcher beside the compile] in
# flashlight/compile_workers.py): run them in one call. The two launcher-beside-ab2 parts
# do the same in the other order (on first), with capture processes on (the default
# since), so that the order of the runs does not decide it. So do the two capture-process-ab
# parts: the cores traced on the main thread and in capture processes (the default;
# [Note: capturing in another process] in flashlight/capture_worker.py).
# tune-configs-fold (first: the compiler changed, and tuning now times each candidate's
# build, so the shipped choices are the fastest-building near the fastest, [Note: a choice
# that builds fast] in flashlight/tuned_configs.py) measures the shipped choices of this GPU
# again; fold-cold-quick-builds then folds with them from empty caches, every record of the
# fold benchmark (its first call is the one the choices shorten). The two static-launch-ab
# parts fold the same records from empty caches with Triton's launcher and PyTorch's static
# one ([Note: the static launcher] in flashlight/compiled_launch.py), one after the other
# in one call (on by default since a third H100 A/B). kernels-fp32-three-products
# measures every float32 (TF32 off) cell again with three TF32 products, the default since
# the report's IEEE cells were measured, and the cost model's candidates that fit.
# Parts writing to their own file re-measure cells of an earlier part after a compiler
# change (the report keeps the newest cell of each implementation): the masked LM
# variants after full-tile loops (and ALiBi's tile skipping) and again after the coarse
# step of the liveness scan, IEEE float32 MSA row attention after the smaller-tile
# configurations. DS4Sci has no -graphs mode past 256 residues: its kernels launch on the
# default stream, outside a captured graph, and its -graphs cells at 256 computed wrong
# results (the plain mode is its fastest valid form). At 1024 residues a whole-model cell
# runs OpenFold chunked (minutes per cell, torch.compile's the longest), so Flashlight's
# is measured before torch.compile's. kernels-flex-flash needs FlexAttention's FLASH
# backend: carry .gpuflash/a, then .gpuflash/b, each in a call of its own (gpu_fetch.sh
# --flash), and run under gpu_run.sh --flash; without it the part says so and stays to do.
PARTS=(
    "tune-configs-fold|$PY -m bench.tune_configs --fold-synthetic 256,512 --max-minutes 9"
    "fold-cold-quick-builds|$PY -m bench.fold_product --lengths 256,512 --msa single,deep --dtypes fp32,bf16 --rows cold --max-minutes 9 --out $R/fold_product_runs/quick_builds.json"
    "kernels-fp32-three-products|$K --variants lm,evoformer --shapes all --dtypes fp32 --impls flashlight,sdpa,torch_compile,flex --out $R/kernels_fp32_three_products.json"
    "launcher-beside-ab2-on|env FLASHLIGHT_LAUNCHER_BESIDE=1 $PY -m bench.fold_product --lengths 256 --msa single,deep --dtypes fp32,bf16 --rows cold --max-minutes 4 --out $R/fold_product_runs/launcher_beside_ab2_1.json"
    "launcher-beside-ab2-off|env FLASHLIGHT_LAUNCHER_BESIDE=0 $PY -m bench.fold_product --lengths 256 --msa single,deep --dtypes fp32,bf16 --rows cold --max-minutes 4 --out $R/fold_product_runs/launcher_beside_ab2_0.json"
    "static-launch-ab-off|env FLASHLIGHT_STATIC_LAUNCH=0 $PY -m bench.fold_product --lengths 256 --msa single,deep --dtypes fp32,bf16 --rows cold --max-minutes 4 --out $R/fold_product_runs/static_launch_off/static_launch_ab_0.json"
    "static-launch-ab-on|env FLASHLIGHT_STATIC_LAUNCH=1 $PY -m bench.fold_product --lengths 256 --msa single,deep --dtypes fp32,bf16 --rows cold --max-minutes 4 --out $R/fold_product_runs/static_launch_ab_1.json"
    "launcher-beside-ab-off|env FLASHLIGHT_LAUNCHER_BESIDE=0 $PY -m bench.fold_product --lengths 256 --msa single,deep --dtypes fp32,bf16 --rows cold --max-minutes 4 --out $R/fold_product_runs/launcher_beside_ab_0.json"
    "launcher-beside-ab-on|env FLASHLIGHT_LAUNCHER_BESIDE=1 $PY -m bench.fold_product --lengths 256 --msa single,deep --dtypes fp32,bf16 --rows cold --max-minutes 4 --out $R/fold_product_runs/launcher_beside_ab_1.json"
    "capture-process-ab-off|env FLASHLIGHT_CAPTURE_PROCESS=0 $PY -m bench.fold_product --lengths 256 --msa single,deep --dtypes fp32,bf16 --rows cold --max-minutes 4 --out $R/fold_product_runs/capture_process_ab_0.json"
    "capture-process-ab-on|env FLASHLIGHT_CAPTURE_PROCESS=1 $PY -m bench.fold_product --lengths 256 --msa single,deep --dtypes fp32,bf16 --rows cold --max-minutes 4 --out $R/fold_product_runs/capture_process_ab_1.json"
    "warm-first-fold|$PY -m bench.warm_first_fold structures/examples/synthetic_256.fasta --rounds 2 --out $R/fold_product_runs/warm_first_fold_256_single_fp32.json"
    "warm-first-fold-bf16|$PY -m bench.warm_first_fold structures/examples/synthetic_256.fasta --rounds 2 --fold-args=--dtype=bf16 --out $R/fold_product_runs/warm_first_fold_256_single_bf16.json"
    "new-forms|$PY -m bench.new_forms --out $R/new_forms.json"
    "fold-product|$PY -m bench.fold_product --rows cold,warm,solo --max-minutes 9 --out $R/fold_product.json"
    "fold-warmup-ab|$PY -m bench.fold_product --lengths 256 --msa deep --dtypes bf16,fp32 --warmup-compile inline,background --repeats 3 --profile-kernels --run-estimate-s 75 --max-minutes 9 --out $R/fold_product_warmup_ab.json"
    "kernels-general|$K --variants attention_lse,rotary,relative_bias,global_column --shapes all --dtypes bf16 --impls flashlight,eager,torch_compile,flex,sdpa --out $R/kernels_general.json"
    "training-kernels|$PY -m bench.training --dtypes bf16 --out $R/training.json"
    "training-step|$PY -m bench.training_step --out $R/training_step.json"
    "training-profile|$PY -m bench.training_profile --out $R/training_step_profile.json"
    "tune-configs|$PY -m bench.tune_configs --max-minutes 9"
    "kernels-core|$K --variants core --shapes all --dtypes bf16,tf32 --impls flashlight,flex,sdpa,cuequivariance,trifast --out $R/kernels_core.json"
    "kernels-headlines-evoformer|$K --variants msa_row_pair_bias,msa_column,triangle_start,triangle_end --shapes 0 --dtypes bf16,tf32 --impls flashlight,flex,sdpa --out $R/kernels_headlines.json"
    "kernels-vector-scan|$K --variants document_mask,cross_attention --shapes all --dtypes bf16 --impls flashlight,flex,torch_compile,sdpa --out $R/kernels_vector_scan.json"
    "kernels-headlines-lm|$K --variants vanilla,causal_tril,document_mask,alibi,softcap,differential --shapes 1,2 --dtypes bf16 --impls flashlight,flex,torch_compile,sdpa --out $R/kernels_headlines.json"
    "ds4sci-build|$PY -m bench.ds4sci --build --max-minutes 9.5"
    "kernels-ds4sci|$K --variants msa_row_pair_bias,msa_column,triangle_start,triangle_end,evoformer_core --shapes all --dtypes bf16 --impls ds4sci,flashlight --out $R/kernels_ds4sci.json"
    "kernels-evoformer-forms|$K --variants evoformer --shapes 0,1,2 --dtypes bf16,tf32 --impls flashlight,flex,sdpa --out $R/kernels_evoformer_forms.json"
    "fold-noise|$PY -m bench.fold_noise --length 256 --depth 5632 --chunk-size none --rounds 3 --out $R/fold_noise_deep_256.json"
    "evoformer-peers-256|$E --retry --n-res 256 --scopes stack,model --modes ds4sci,cueq,stock,flashlight --dtypes bf16,tf32 --out $R/evoformer_peers.json"
    "evoformer-peers-graphs-256|$E --retry --n-res 256 --scopes stack,model --modes ds4sci-graphs,cueq-graphs,stock-graphs,flashlight-graphs --dtypes bf16,tf32 --out $R/evoformer_peers.json"
    "evoformer-peers-512|$E --retry --n-res 512 --scopes stack,model --modes ds4sci,cueq,stock,flashlight --dtypes bf16,tf32 --out $R/evoformer_peers.json"
    "evoformer-peers-graphs-512|$E --retry --n-res 512 --scopes model,stack --modes flashlight-graphs,cueq-graphs,stock-graphs --dtypes bf16,tf32 --out $R/evoformer_peers.json"
    "fidelity|$PY -m bench.fidelity --seeds 0,1,2 --max-minutes 9 --out $R/fidelity.json"
    "long-chain|$PY -m bench.long_chain --max-minutes 9 --out $R/long_chain.json"
    "kernels-flex-flash|$K --variants msa_row_pair_bias,msa_column,triangle_start,triangle_end,evoformer_core,vanilla,causal_tril --shapes 0 --dtypes bf16 --impls flex_flash,flex,flashlight --require flex_flash --out $R/kernels_flex_flash.json"
    "kernels-flex-flash-lm|$K --variants vanilla,causal_tril --shapes 1,2 --dtypes bf16 --impls flex_flash,flex,flashlight,torch_compile,sdpa --require flex_flash --out $R/kernels_flex_flash.json"
    "sdpa-gate|$PY -m bench.sdpa_gate --profile --out $R/sdpa_gate.json"
    "point-attention|$PY -m bench.point_attention --out $R/point_attention.json"
    "evoformer-peers-1024|$E --retry --n-res 1024 --scopes stack,model --modes ds4sci,cueq,flashlight,stock --dtypes bf16,tf32 --out $R/evoformer_peers.json"
    "kernels-evoformer-main|$K --variants evoformer --shapes 0 --dtypes bf16,tf32,fp32 --out $R/kernels_evoformer.json"
    "evoformer-256|$E --retry --n-res 256 --scopes stack,model --out $R/evoformer.json"
    "kernels-evoformer-bf16|$K --variants evoformer --shapes all --dtypes bf16 --out $R/kernels_evoformer.json"
    "kernels-lm-bf16-1k|$K --variants lm --shapes 1 --dtypes bf16 --out $R/kernels_lm.json"
    "evoformer-512|$E --retry --n-res 512 --scopes stack,model --out $R/evoformer.json"
    "kernels-lm-masked|$K --variants causal_tril,causal_triu,causal_index,alibi,sliding_window,prefix_lm,document_mask,gqa,differential,cross_attention --shapes all --dtypes bf16 --impls flashlight --out $R/kernels_lm_masked.json"
    "kernels-evoformer-fma|$K --variants msa_row_pair_bias --shapes all --dtypes fp32 --impls flashlight --out $R/kernels_evoformer_fma.json"
    "kernels-lm-masked-scan|$K --variants causal_tril,causal_triu,causal_index,alibi,sliding_window,prefix_lm,document_mask,gqa,cross_attention --shapes all --dtypes bf16 --impls flashlight --out $R/kernels_lm_masked_scan.json"
    "kernels-lm-bf16|$K --variants lm --shapes all --dtypes bf16 --out $R/kernels_lm.json"
    "kernels-lm-sinks|$K --variants attention_sinks --shapes all --dtypes bf16 --out $R/kernels_lm_sinks.json"
    "kernels-evoformer-fp32|$K --variants evoformer --shapes all --dtypes tf32,fp32 --out $R/kernels_evoformer.json"
    "evoformer-1024|$E --retry --n-res 1024 --scopes stack,model --modes stock,flashlight,compile --out $R/evoformer.json"
    "kernels-lm-fp32|$K --retry --variants lm --shapes all --dtypes tf32,fp32 --out $R/kernels_lm.json"
    "training-step-block|$PY -m bench.training_step --scope block --out $R/training_step_block.json"
    "dropout|$PY -m bench.dropout --out $R/dropout.json"
    "training-shared-keys|$PY -m bench.training --dtypes bf16 --cases gqa,mqa --out $R/training_shared_keys.json"
    "training-lm|$PY -m bench.training --dtypes bf16 --cases gqa,mqa,causal_tril,document_mask --out $R/training_lm.json"
    "training-lm-repeats-inside|env FLASHLIGHT_REPEATS_OUTSIDE=0 $PY -m bench.training --dtypes bf16 --cases mqa --impls flashlight --out $R/training_lm_repeats_inside.json"
)

part_name() { echo "${1%%|*}"; }
part_cmd() { echo "${1#*|}"; }
is_done() { grep -qsx "$1" "$DONE"; }
left() { echo $((FLASHLIGHT_BUDGET_END - $(date +%s))); }
say() { printf '[run_all %4ss left] %s\n' "$(left)" "$*"; }

if [ "${1:-}" = "--list" ]; then
    for p in "${PARTS[@]}"; do
        n="$(part_name "$p")"
        if is_done "$n"; then s=done; else s=todo; fi
        printf '%-24s %-5s %s\n' "$n" "$s" "$(part_cmd "$p")"
    done
    exit 0
fi
selected=("$@")
for n in "${selected[@]}"; do
    found=0
    for p in "${PARTS[@]}"; do [ "$(part_name "$p")" = "$n" ] && found=1; done
    if [ "$found" = 0 ]; then
        echo "run_all: no part named '$n' (bash bench/run_all.sh --list shows them)" >&2
        exit 2
    fi
done
# the parts to run: those named, in the order named; else all, in the order above
order=()
if [ ${#selected[@]} -gt 0 ]; then
    for n in "${selected[@]}"; do
        for p in "${PARTS[@]}"; do [ "$(part_name "$p")" = "$n" ] && order+=("$p"); done
    done
else
    order=("${PARTS[@]}")
fi

summary() {
    "$PY" -m bench.report --summary 2>/dev/null || true
}

all_done=1
for p in "${order[@]}"; do
    n="$(part_name "$p")"
    if is_done "$n"; then
        say "$n: complete"
        continue
    fi
    while :; do
        if [ "$(left)" -lt 60 ]; then
            say "out of time for this call; run the same command again to continue"
            summary
            exit 3
        fi
        say "$n: $(part_cmd "$p")"
        # shellcheck disable=SC2046
        $(part_cmd "$p")
        rc=$?
        case $rc in
            0) echo "$n" >>"$DONE"; say "$n: complete"; break ;;
            3) say "$n: stopped by the time budget; run the same command again to continue"
               summary
               exit 3 ;;
            4) say "$n: a CUDA error ended the process (recorded); restarting the part" ;;
            *) say "$n: FAILED with status $rc (see the output above); going on with the next part"
               all_done=0
               break ;;
        esac
    done
done
summary
if [ "$all_done" = 1 ] && [ ${#selected[@]} -eq 0 ]; then
    say "ALL PARTS COMPLETE"
fi
