"""The bare Evoformer attention core with each bias term on or off, Flashlight against
FlexAttention in one run: where the bf16 core's time goes.

    python -m bench.core_terms [--terms both,pair,mask,none] [--shapes 3] [--out FILE.json]

``both`` is :func:`bench.variants_core.evoformer_core` (mask bias ``[N, 1, 1, L]`` and
pair bias ``[1, H, L, L]``); ``pair`` and ``mask`` keep one bias, ``none`` neither. Each
term is compiled by Flashlight (``flashlight.compile``, its autotuning as configured by
the environment: ``FLASHLIGHT_AUTOTUNE=full`` tries every configuration) and by
FlexAttention (``torch.compile(flex_attention)``, the bias read in ``score_mod``), on the
same seeded bf16 inputs; the time is ``triton.testing.do_bench``'s median. The
difference between terms is what a bias costs each implementation. CUDA only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform

import torch

TERMS = ("both", "pair", "mask", "none")
SHAPES = ((512, 256, 8, 32), (512, 1024, 8, 32), (256, 256, 4, 32))  # N, L, H, c


def core(term: str):
    """The core with ``term``'s biases: ``(q, k, v, mask_bias, pair_bias) -> [N, H, L, c]``."""

    def fn(q, k, v, mask_bias, pair_bias):
        # q, k, v: [N, H, L, c]; mask_bias: [N, 1, 1, L]; pair_bias: [1, H, L, L]
        a = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [N, H, L, L]
        if term in ("both", "mask"):
            a = a + mask_bias
        if term in ("both", "pair"):
            a = a + pair_bias
        return torch.matmul(torch.softmax(a, dim=-1), v)

    fn.__name__ = f"core_{term}"
    return fn


def flex(term: str):
    """FlexAttention's form of :func:`core`: the biases read in ``score_mod``."""
    from torch.nn.attention.flex_attention import flex_attention

    def fn(q, k, v, mask_bias, pair_bias):
        N, H, L, _ = q.shape
        mask = mask_bias.view(N, L)
        pair = pair_bias.view(H, L, L)

        def score_mod(score, b, h, q_idx, kv_idx):
            if term in ("both", "mask"):
                score = score + mask[b, kv_idx]
            if term in ("both", "pair"):
                score = score + pair[h, q_idx, kv_idx]
            return score

        return flex_attention(q, k, v, score_mod=score_mod)

    return fn


def inputs(N: int, L: int, H: int, c: int, dtype: torch.dtype, device: str = "cuda") -> tuple:
    """Seeded q, k, v ``[N, H, L, c]``, a mask bias and a pair bias: the catalog core's
    inputs (:data:`bench.variants_core.CORE_VARIANTS`)."""
    from bench.variants_core import CORE_VARIANTS

    generator = torch.Generator(device=device).manual_seed(0)
    return CORE_VARIANTS[0].make_inputs({"N": N, "L": L, "H": H, "c": c}, dtype, device, generator)


def measure(term: str, shape: tuple, label: str) -> dict:
    from triton.testing import do_bench

    import flashlight
    from flashlight.report import ExplainReport

    N, L, H, c = shape
    args = inputs(N, L, H, c, torch.bfloat16)
    report = ExplainReport()
    compiled = flashlight.compile(core(term), report=report)
    ref = core(term)(*[a.double() for a in args])
    err = (compiled(*args).double() - ref).abs().max().item()
    ms = do_bench(lambda: compiled(*args), warmup=25, rep=200, return_mode="median")
    peer = torch.compile(flex(term))
    peer(*args)
    flex_ms = do_bench(lambda: peer(*args), warmup=25, rep=200, return_mode="median")
    configs = [list(c) if c != "eager" else c for k in report.kernels for c in k.chosen_configs().values()]
    torch._dynamo.reset()
    return {"label": label, "N": N, "L": L, "H": H, "c": c, "term": term, "flashlight_ms": round(ms, 4),
            "flex_ms": round(flex_ms, 4), "flex_over_flashlight": round(flex_ms / ms, 3),
            "configs": configs, "max_abs_err_vs_float64": err}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.core_terms", description=__doc__.split("\n\n")[0])
    p.add_argument("--terms", default=",".join(TERMS))
    p.add_argument("--shapes", type=int, default=len(SHAPES), help=f"the first K of {SHAPES}")
    p.add_argument("--label", default="default", help="names the run in the rows (e.g. the autotuning setting)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import triton

    rows = [measure(term, shape, args.label) for shape in SHAPES[:args.shapes] for term in args.terms.split(",")]
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "autotune": os.environ.get("FLASHLIGHT_AUTOTUNE", "")}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)
    print("label N L term flashlight_ms flex_ms flex/flashlight configs")
    for r in rows:
        print(r["label"], r["N"], r["L"], r["term"], r["flashlight_ms"], r["flex_ms"], r["flex_over_flashlight"], r["configs"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
