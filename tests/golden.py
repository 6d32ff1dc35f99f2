"""Golden outputs of the compiler: the Triton source it prints for the catalog variants.

``python -m tests.golden --out DIR`` writes, for every variant of :mod:`bench.variants`
(at its small ``default_shape``) in float32 and bfloat16, the GPU-path source of each
kernel (``interpret=False``, fp32 contractions as ``tf32`` and as ``ieee``), the
interpreter's source and the GPU source with ``check_bounds``, one file per kernel, so two runs can be compared with ``diff -r``.

``python -m tests.golden --update`` rewrites the committed golden files of
``tests/golden/``: for a few variants, the IR after each pass (as ``FLASHLIGHT_DEBUG=2``
logs it) and the GPU source, which ``tests/test_golden.py`` compares against. Run it
after a change that alters them on purpose, and read the diff before committing it.

The graphs are captured the way the backend captures them (AOTAutograd with
Flashlight's decompositions) and compiled by the compiler's own entry points; nothing
is launched: the captured graph runs eagerly.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PRECISIONS = ("tf32", "ieee")
GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
# the variants whose IR and source are committed under tests/golden/
GOLDEN_VARIANTS = ("vanilla", "causal_tril", "msa_row_pair_bias", "document_mask")


def capture(fn, inputs) -> list:
    """The ATen graphs the backend would compile for ``fn(*inputs)`` (static shapes)."""
    from torch._dynamo.backends.common import aot_autograd

    from flashlight.decompositions import decompositions

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    backend = aot_autograd(fw_compiler=keep, inference_compiler=keep, decompositions=decompositions(inference=True))
    torch.compiler.reset()
    with torch.no_grad():
        torch.compile(fn, backend=backend, dynamic=False)(*inputs)
    torch.compiler.reset()
    return graphs


def variant_inputs(name: str, dtype: torch.dtype):
    from bench.variants import VARIANTS

    v = VARIANTS[name]
    return v.fn, v.make_inputs(v.default_shape, dtype, "cpu", torch.Generator().manual_seed(0))


def sources(name: str, dtype: torch.dtype) -> dict[str, str]:
    """File name -> text: every kernel's sources for variant ``name`` in ``dtype``."""
    from flashlight.codegen import generate
    from flashlight.lower import lower
    from flashlight.pipeline import compile_graph

    out: dict[str, str] = {}
    for g, gm in enumerate(capture(*variant_inputs(name, dtype))):
        plan = compile_graph(lower(gm))
        for node, tiled in plan.kernels.items():
            stem = f"graph{g}.{node}"
            for precision in PRECISIONS:
                out[f"{stem}.gpu.{precision}.py"] = generate(tiled, None, precision, interpret=False).source
            out[f"{stem}.interpret.py"] = generate(tiled, None, "ieee", interpret=True).source
            out[f"{stem}.bounds.py"] = generate(tiled, None, "tf32", interpret=False, check_bounds=True).source
        if plan.rejected:
            out[f"graph{g}.rejected.txt"] = "".join(f"{k}: {v}\n" for k, v in sorted(plan.rejected.items()))
    return out


def ir_trace(name: str, dtype: torch.dtype) -> str:
    """The IR of variant ``name`` after each pass, as ``FLASHLIGHT_DEBUG=2`` logs it."""
    import logging

    from flashlight import settings
    from flashlight.lower import lower
    from flashlight.pipeline import compile_graph

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("flashlight")
    handler, propagate = Keep(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for gm in capture(*variant_inputs(name, dtype)):
            with settings.override(debug=2):
                compile_graph(lower(gm))
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    return "\n".join(records) + "\n"


def golden_files() -> dict[str, str]:
    """Path under ``tests/golden/`` -> expected text, for :data:`GOLDEN_VARIANTS`."""
    files = {}
    for name in GOLDEN_VARIANTS:
        for key, dtype in DTYPES.items():
            files[f"{name}.{key}.ir.txt"] = ir_trace(name, dtype)
            for file, text in sources(name, dtype).items():
                if ".gpu." in file and (key == "fp32" or file.endswith(".tf32.py")):
                    files[f"{name}.{key}.{file}"] = text
    return files


def update() -> int:
    """Rewrite ``tests/golden/`` from the compiler as it is; returns the file count."""
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    for old in os.listdir(GOLDEN_DIR):
        os.unlink(os.path.join(GOLDEN_DIR, old))
    files = golden_files()
    for file, text in files.items():
        with open(os.path.join(GOLDEN_DIR, file), "w") as f:
            f.write(text)
    return len(files)


def dump(out_dir: str, names=None) -> int:
    """Write every variant's sources under ``out_dir/<variant>/<dtype>/``; returns the count."""
    from bench.variants import VARIANTS

    count = 0
    for name in names or VARIANTS:
        for key, dtype in DTYPES.items():
            folder = os.path.join(out_dir, name, key)
            os.makedirs(folder, exist_ok=True)
            for file, text in sources(name, dtype).items():
                with open(os.path.join(folder, file), "w") as f:
                    f.write(text)
                count += 1
    return count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write every variant's sources into this folder")
    parser.add_argument("--variants", nargs="*", help="only these variants")
    parser.add_argument("--update", action="store_true", help="rewrite the committed golden files")
    args = parser.parse_args(argv)
    if not (args.out or args.update):
        parser.error("give --out DIR or --update")
    if args.out:
        print(f"{dump(args.out, args.variants)} files written to {args.out}")
    if args.update:
        print(f"{update()} golden files written to {GOLDEN_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
