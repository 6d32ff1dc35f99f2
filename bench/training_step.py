"""One OpenFold ``model_1`` training step, stock and Flashlight-patched.

The model is OpenFold's ``model_config("model_1", train=True)`` (activation
checkpointing per block, dropout on, no chunking) with seeded random weights (the
attention modules' parameters all drawn), no templates and no recycling, on a
synthetic record of ``--residues`` residues with ``--clusters`` MSA rows and ``--extra``
extra-MSA rows. The loss is a fixed random weighting of the single, pair and
distogram outputs and the final atom positions (a differentiable loss over what the
structure losses read). Dropout masks are seeded alike for both models.

Reported per model: the first step (compiles included), the median of ``--steps``
steps, and peak memory above what the model and batch hold.

    python -m bench.training_step --out bench/results/training_step.json
"""
from __future__ import annotations

import argparse
import copy
import json
import pathlib
import statistics
import time

import torch

from bench.common import atomic_write_json, environment, short_error

OUTPUTS = ("single", "pair", "distogram_logits", "final_atom_positions")


def build(residues: int, clusters: int, extra: int):
    from openfold.config import model_config

    from flashlight.integrations import openfold_testing as oft

    config = model_config("model_1", train=True)
    config.model.template.enabled = False
    config.data.common.max_recycling_iters = 0
    config.data.predict.max_msa_clusters = clusters
    config.data.predict.max_extra_msa = extra
    letters = "ACDEFGHIKLMNPQRSTVWY"
    sequence = "".join(letters[(7 * i + i // 20) % 20] for i in range(residues))
    torch.manual_seed(0)
    batch = oft.model_batch(config, sequence, n_alignments=clusters + extra, seed=0)
    model = oft.random_model(config, seed=0)
    return model, {k: v.cuda() for k, v in batch.items()}


def step(model, batch, weights):
    torch.manual_seed(1)  # the same dropout masks for every model and step
    out = model(batch)
    loss = sum((out[k].float() * weights[k]).sum() for k in OUTPUTS)
    loss.backward()
    return loss.detach()


def loss_weights(model, batch) -> dict[str, torch.Tensor]:
    """The loss's fixed random weight of each output, shaped like it (one pass of
    ``model``, on the GPU, in eval mode, to learn the shapes); leaves it in train mode."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    model.cuda().eval()
    with torch.no_grad():
        probe = model(batch)
    model.train()
    return {k: torch.randn(probe[k].shape, generator=gen, device="cuda") / probe[k].numel() for k in OUTPUTS}


def measure(model, batch, steps: int) -> dict:
    weights = loss_weights(model, batch)
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = step(model, batch, weights)
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        loss = step(model, batch, weights)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() - base
    grads = {n: p.grad.norm().item() for n, p in model.named_parameters() if p.grad is not None}
    return {"first_step_s": round(first, 2), "step_s": round(statistics.median(times), 4),
            "steps_s": [round(t, 4) for t in times], "peak_gib": round(peak / 2**30, 3),
            "loss": loss.item(), "grad_norms": grads}


NEAR_ZERO = 1e-3  # of the median gradient norm: below it, a gradient is rounding noise


def grad_differences(stock: dict[str, float], patched: dict[str, float], worst: int = 5) -> dict:
    """The parameters whose gradient norms differ most between the two models, relative to
    stock's, among those with a gradient above :data:`NEAR_ZERO` of the median; the others
    are listed apart with their largest norm. Some gradients are zero in exact arithmetic
    (a layer norm's bias feeding only a softmax's logits through a bias shared by a whole
    row: the softmax's gradient sums to zero over the keys), so both models give rounding
    noise there, and a ratio of two noises says nothing."""
    names = [n for n in stock if n in patched]
    floor = NEAR_ZERO * statistics.median(stock[n] for n in names) if names else 0.0
    real = [n for n in names if max(stock[n], patched[n]) > floor]
    rel = sorted(((abs(stock[n] - patched[n]) / stock[n], n) for n in real if stock[n] > 0), reverse=True)
    noise = [n for n in names if n not in real]
    return {"worst_grad_norm_differences": rel[:worst],
            "near_zero_gradients": {"count": len(noise), "floor": floor,
                                    "largest": max((max(stock[n], patched[n]) for n in noise), default=0.0)}}


def main(argv=None) -> int:
    import flashlight

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--residues", type=int, default=256)
    parser.add_argument("--clusters", type=int, default=128)
    parser.add_argument("--extra", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision", choices=("tf32", "fp32"), default="tf32")
    parser.add_argument("--scope", choices=("attention", "block"), default="attention",
                        help="patch_openfold's scope: the attention cores, or whole blocks compiled "
                             "as training graphs (Inductor for the rest of each block)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/training_step.json"))
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    model, batch = build(args.residues, args.clusters, args.extra)
    patched = copy.deepcopy(model)
    flashlight.patch_openfold(patched, scope=args.scope)
    rows = {}
    for name, m in (("stock", model), ("flashlight", patched)):
        try:
            rows[name] = measure(m, batch, args.steps)
        except Exception as exc:  # noqa: BLE001 - recorded
            rows[name] = {"error": short_error(exc)}
        m.cpu()
        torch.cuda.empty_cache()
        print(name, json.dumps({k: v for k, v in rows[name].items() if k != "grad_norms"}), flush=True)
    # whole blocks draw their dropout masks with Flashlight's generator: other masks, other gradients
    same_masks = args.scope == "attention"
    if same_masks and "grad_norms" in rows.get("stock", {}) and "grad_norms" in rows.get("flashlight", {}):
        rows.update(grad_differences(rows["stock"]["grad_norms"], rows["flashlight"]["grad_norms"]))
        print("worst relative grad-norm differences", rows["worst_grad_norm_differences"],
              "; near-zero gradients:", rows["near_zero_gradients"])
    for row in rows.values():
        if isinstance(row, dict):
            row.pop("grad_norms", None)
    atomic_write_json(args.out, {"schema": "flashlight-bench-training-step/1", "environment": environment("cuda"),
                                 "config": vars(args) | {"out": str(args.out)}, "results": rows})
    if "step_s" in rows.get("stock", {}) and "step_s" in rows.get("flashlight", {}):
        s, f = rows["stock"], rows["flashlight"]
        print(f"step: stock {s['step_s']:.3f} s, flashlight {f['step_s']:.3f} s ({s['step_s'] / f['step_s']:.2f}x); "
              f"peak: stock {s['peak_gib']:.2f} GiB, flashlight {f['peak_gib']:.2f} GiB "
              f"({f['peak_gib'] / s['peak_gib']:.2f}x); first step: {s['first_step_s']} / {f['first_step_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
