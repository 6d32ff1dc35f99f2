"""What one OpenFold block keeps for its backward pass: stock, attention cores patched,
whole block compiled.

In a ``model_1`` training step every block is checkpointed: the forward keeps only each
block's inputs, and the backward runs one block again with autograd, holding what that
block saves for its backward until its gradients are done. That is the part of the
step's peak memory a patch can change (the checkpointed inputs, parameters and
gradients are the same for every model). This script counts it: one block of
``model_1``'s dimensions in ``train()`` mode (dropout on) runs forward and backward
under :func:`torch.autograd.graph.saved_tensors_hooks`, and every distinct storage
saved (not the block's parameters or inputs) is recorded with its size.

The block runs at small sizes with prime lengths (``S`` = 11 sequences, ``R`` = 13
residues), on the CPU through the Triton interpreter where no GPU is present: each
saved storage's element count factors as ``S^a R^b c`` with a channel constant ``c``,
which gives its size at the training sizes (``--residues``, ``--clusters``,
``--extra``) exactly, without running them. These are counts of what autograd keeps,
not a timing or a measured peak (that is ``bench/training_step.py``, on a GPU); the
allocator's fragmentation and the backward's own temporaries come on top.

    TRITON_INTERPRET=1 python -m bench.training_saved --out bench/results/training_saved.json
"""
from __future__ import annotations

import argparse
import copy
import json
import pathlib

import torch

from bench.common import atomic_write_json, environment

S, R = 11, 13  # prime lengths: a storage's size factors as S^a R^b c
MODES = ("stock", "attention", "block")


def _blocks():
    """The block classes of ``model_1``'s training config, with their dimensions, and
    the MSA depth argument that sets their ``S``."""
    from openfold.config import model_config
    from openfold.model.evoformer import EvoformerBlock, ExtraMSABlock

    config = model_config("model_1", train=True).model
    evo = {k: v for k, v in config.evoformer_stack.items()
           if k not in ("blocks_per_ckpt", "c_s", "clear_cache_between_blocks", "no_blocks", "tune_chunk_size")}
    extra = {k: v for k, v in config.extra_msa.extra_msa_stack.items()
             if k not in ("clear_cache_between_blocks", "no_blocks", "tune_chunk_size")}
    # the extra-MSA block's own checkpoint would hide its recomputation from the hooks;
    # what that recomputation saves is what is counted
    extra["ckpt"] = False
    return {"evoformer": (EvoformerBlock, evo, "clusters"), "extra_msa": (ExtraMSABlock, extra, "extra")}


def saved_storages(block: torch.nn.Module, inputs: list[torch.Tensor]) -> list[dict]:
    """Every distinct storage autograd saves in one forward of ``block`` (not its
    parameters or inputs); runs the backward too, so that a compiled block's backward
    graph is exercised."""
    found: dict[int, dict] = {}
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()}
    m, z, msa_mask, pair_mask = (t.clone().requires_grad_(k < 2) for k, t in enumerate(inputs))
    skip |= {t.untyped_storage().data_ptr() for t in (m, z, msa_mask, pair_mask)}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip and storage.data_ptr() not in found:
            found[storage.data_ptr()] = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                                         "elements": storage.nbytes() // t.element_size(),
                                         "element_bytes": t.element_size()}
        return t

    torch.manual_seed(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out_m, out_z = block(m, z, msa_mask=msa_mask, pair_mask=pair_mask, chunk_size=None, inplace_safe=False)
    (out_m.sum() + out_z.sum()).backward()
    return list(found.values())


def factor(elements: int) -> tuple[int, int, int]:
    """``(a, b, c)`` with ``elements == S**a * R**b * c``."""
    a = b = 0
    while elements % S == 0:
        elements, a = elements // S, a + 1
    while elements % R == 0:
        elements, b = elements // R, b + 1
    return a, b, elements


def bytes_at(storage: dict, sequences: int, residues: int) -> int:
    a, b, c = factor(storage["elements"])
    return sequences ** a * residues ** b * c * storage["element_bytes"]


def run_block(cls, dims: dict, mode: str, sequences: int, residues: int) -> dict:
    import flashlight
    from flashlight import settings
    from flashlight.integrations import openfold_testing as oft
    from flashlight.integrations.openfold_compat import cpu_compat

    gen = torch.Generator().manual_seed(0)
    block = cls(**dims).train()
    oft.randomize_(block, gen, gain=0.5)
    inputs = [torch.randn(S, R, dims["c_m"], generator=gen), torch.randn(R, R, dims["c_z"], generator=gen),
              oft.random_mask((S, R), gen), oft.random_mask((R, R), gen)]
    if mode != "stock":
        block = copy.deepcopy(block)
        flashlight.patch_openfold(block, scope=mode)
    # cpu_compat: OpenFold's softmax extension on CPU tensors, saving what it saves on a GPU
    with settings.override(on_error="raise", remainder="inductor"), cpu_compat():
        storages = saved_storages(block, inputs)
    sized = sorted(({**s, "bytes": bytes_at(s, sequences, residues)} for s in storages), key=lambda s: -s["bytes"])
    return {"mib": round(sum(s["bytes"] for s in sized) / 2**20, 1), "storages": len(sized),
            "largest": [{"shape_at_small_sizes": s["shape"], "dtype": s["dtype"],
                         "mib": round(s["bytes"] / 2**20, 1)} for s in sized[:8]]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--residues", type=int, default=256)
    parser.add_argument("--clusters", type=int, default=128)
    parser.add_argument("--extra", type=int, default=1024)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/training_saved.json"))
    args = parser.parse_args(argv)
    results = {}
    for name, (cls, dims, depth) in _blocks().items():
        sequences = getattr(args, depth)
        results[name] = {"sequences": sequences, "residues": args.residues,
                         **{mode: run_block(cls, dims, mode, sequences, args.residues) for mode in MODES}}
        row = results[name]
        print(f"{name} ({sequences} x {args.residues}): saved for backward, MiB: "
              + ", ".join(f"{m} {row[m]['mib']}" for m in MODES)
              + f" (block / stock {row['block']['mib'] / row['stock']['mib']:.2f}x, "
              f"attention / stock {row['attention']['mib'] / row['stock']['mib']:.2f}x)", flush=True)
    atomic_write_json(args.out, {"schema": "flashlight-bench-training-saved/1", "environment": environment("cpu"),
                                 "config": vars(args) | {"out": str(args.out), "small_sizes": [S, R]},
                                 "results": results})
    print(json.dumps({n: {m: r[m]["mib"] for m in MODES} for n, r in results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
