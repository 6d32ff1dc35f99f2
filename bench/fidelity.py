"""bf16 fidelity: stock OpenFold and Flashlight in bf16 against the same model in IEEE fp32.

    python -m bench.fidelity [--n-res 256,512] [--seeds 0,1,2] [--out bench/results/fidelity.json]

For each length: ``model_1`` with seeded random weights (templates off, 512 MSA rows,
5120 extra rows, one pass, unchunked) on a synthetic feature batch, run once in IEEE
float32 (TF32 off): the reference. Then the same weights and inputs in bf16, stock
(``stock_bf16``) and patched by Flashlight (``flashlight_bf16``). Per variant, against the
reference in the same frame (no superposition): RMS and max deviation of the atom
positions over the atoms that exist (Å), the mean and max absolute pLDDT difference, and
the relative RMS deviation of the trunk's final single and pair representations (the
structure module amplifies small differences chaotically; the trunk's outputs show what
reaches it). The weights are random, so the outputs are not protein structures; the
deviations measure what bf16 does to the same computation. Each seed draws other weights
and inputs, so a difference between the variants can be told from one draw's luck.
Cells (n_res, seed, variant) in ``--out`` are skipped; exit status 3 when the time
budget ran out (run again).
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import pathlib
import sys
import time

VARIANTS = ("stock_bf16", "flashlight_bf16")
EXIT_COMPLETE, EXIT_INCOMPLETE = 0, 3


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--n-res", default="256,512")
    p.add_argument("--n-seq", type=int, default=512)
    p.add_argument("--n-extra", type=int, default=5120)
    p.add_argument("--blocks", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--max-minutes", type=float, default=9.0)
    p.add_argument("--device", default=None)
    p.add_argument("--seeds", default="0", help="weights and inputs per seed, e.g. 0,1,2")
    return p.parse_args(argv)


def deviation(ref: dict, got: dict) -> dict:
    """Atom RMS / max deviation (Å, same frame) and pLDDT differences of ``got`` from ``ref``."""
    import torch

    mask = ref["mask"] > 0.5  # [N, 37]
    dist = (got["pos"].double() - ref["pos"].double()).norm(dim=-1)[mask]
    dplddt = (got["plddt"].double() - ref["plddt"].double()).abs()
    found = {"atoms": int(mask.sum()), "rms_atom_deviation_A": float(dist.pow(2).mean().sqrt()),
             "max_atom_deviation_A": float(dist.max()), "mean_plddt_difference": float(dplddt.mean()),
             "max_plddt_difference": float(dplddt.max()),
             "finite": bool(all(torch.isfinite(t).all() for t in got.values()))}
    for name in ("single", "pair"):  # the trunk's outputs: ||got - ref|| / ||ref||
        if name in ref:
            found[f"{name}_relative_rms"] = float((got[name].double() - ref[name].double()).norm()
                                                  / ref[name].double().norm())
    return found


def _prediction(model, batch) -> dict:
    import torch

    with torch.no_grad():
        out = model(dict(batch))
    return {"pos": out["final_atom_positions"].float().cpu(), "plddt": out["plddt"].float().cpu(),
            "mask": batch["atom37_atom_exists"][..., -1].float().cpu(),
            "single": out["single"].float().cpu(), "pair": out["pair"].float().cpu()}


def run_length(args, n_res: int, seed: int, variants: list[str], device: str) -> dict[str, dict]:
    """The reference and each variant at ``n_res`` with ``seed``'s weights and inputs;
    variant -> its deviation record."""
    import torch

    import flashlight
    from bench.common import set_precision
    from bench.evoformer_inputs import build_model, model_config, synthetic_batch

    model = build_model(model_config(args.blocks, args.n_extra), seed, device)
    batch = synthetic_batch(n_res, args.n_seq, args.n_extra, 1, device, seed)
    set_precision("fp32")  # IEEE float32, TF32 off
    t0 = time.perf_counter()
    ref = _prediction(model, batch)
    ref_s = time.perf_counter() - t0
    found = {}
    half = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}
    for variant in variants:
        low = copy.deepcopy(model).to(torch.bfloat16)
        if variant == "flashlight_bf16":
            flashlight.patch_openfold(low)
        found[variant] = {**deviation(ref, _prediction(low, half)), "reference_s": round(ref_s, 2),
                          "reference_mean_plddt": float(ref["plddt"].mean())}
        del low
        gc.collect()
    return found


def main(argv: list[str] | None = None) -> int:
    import torch

    from bench.common import RESULTS, Deadline, TimeUp, atomic_write_json, budget_from_env, environment, short_error
    from bench.evoformer import wait_for_openfold

    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = pathlib.Path(args.out) if args.out else RESULTS / "fidelity.json"
    data = json.loads(out.read_text()) if out.exists() else {"schema": "flashlight-bench-fidelity/1",
                                                             "runs": [], "cells": []}
    have = {(c["n_res"], c.get("seed", 0), c["variant"]) for c in data["cells"]}
    lengths = [int(n) for n in args.n_res.split(",") if n.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    todo = {(n, s): [v for v in VARIANTS if (n, s, v) not in have] for s in seeds for n in lengths}
    todo = {key: vs for key, vs in todo.items() if vs}
    if not todo:
        print(f"bench.fidelity: every cell is already in {out}")
        return 0
    deadline = Deadline(budget_from_env(args.max_minutes))
    why = wait_for_openfold(deadline, print)
    if why:
        print(f"bench.fidelity: {why}")
        return 1
    meta = {"id": len(data["runs"]), **environment(device), "args": vars(args)}
    data["runs"].append(meta)
    for (n, seed), variants in todo.items():
        if deadline.remaining() < 90:
            print("bench.fidelity: time budget reached; run the same command again to continue")
            return EXIT_INCOMPLETE
        try:
            with deadline.step():
                found = run_length(args, n, seed, variants, device)
        except TimeUp:
            print("bench.fidelity: time budget reached; run the same command again to continue")
            return EXIT_INCOMPLETE
        except Exception as exc:  # noqa: BLE001 - recorded
            found = {v: {"status": "error", "message": short_error(exc, 600)} for v in variants}
        for variant, rec in found.items():
            data["cells"].append({"n_res": n, "seed": seed, "variant": variant, "run": meta["id"], "status": "ok", **rec,
                                  "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            print(f"  N_res {n} seed {seed} {variant}: " + (
                f"RMS {rec['rms_atom_deviation_A']:.3g} Å, max {rec['max_atom_deviation_A']:.3g} Å, "
                f"pLDDT max {rec['max_plddt_difference']:.3g}, single {rec.get('single_relative_rms', 0):.3g}, "
                f"pair {rec.get('pair_relative_rms', 0):.3g}" if "rms_atom_deviation_A" in rec
                else rec.get("message", "")), flush=True)
        atomic_write_json(out, data)
        if device == "cuda":
            torch.cuda.empty_cache()
    atomic_write_json(out, data)
    return EXIT_COMPLETE


if __name__ == "__main__":
    sys.exit(main())
