"""Where the document-mask kernel's time goes: its scan, its masked tiles, its full tiles.

Launches edited copies of the generated kernel's source with the arguments the kernel
was launched with (README.md in this folder). On a CUDA GPU:
``PYTHONPATH=. OUT=/tmp/out python bench/results/vector_scan/split.py``; on the CPU it
runs a small shape through the Triton interpreter (a check that the edits apply).
"""
import importlib.util, json, os, re, sys, tempfile
import torch
os.environ["FLASHLIGHT_TUNING_CACHE"] = "0"
import flashlight
from flashlight import launch_plan
from bench.common import bench_ms
from bench.variants_lm_masked import document_mask, _document_inputs, _document_mod
from bench.variants_base import data_block_mask
from torch.nn.attention.flex_attention import flex_attention

dev = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = dev == "cpu"
g = torch.Generator(device=dev).manual_seed(0)
H, L, D, n = (2, 512, 128, 4) if SMALL else (32, 16384, 128, 32)
q, k, v, doc = _document_inputs({"H": H, "L": L, "D": D, "n_docs": n}, torch.bfloat16, dev, g)

captured = {}
from flashlight.runtime import Launcher
orig = Launcher._first_launch
def spy(self, fn, args, *rest, **kw):
    captured["args"] = args
    return orig(self, fn, args, *rest, **kw)
Launcher._first_launch = spy
c = flashlight.compile(document_mask)
ref = c(q, k, v, doc); ref = c(q, k, v, doc)
args = captured["args"]
out = args[4]
src = flashlight.explain(document_mask, q, k, v, doc).kernels[0].source
name = re.search(r"def (flashlight_\w+)\(", src).group(1)

def variant(text, tag):
    path = os.path.join(tempfile.mkdtemp(), f"v_{tag}.py")
    open(path, "w").write(text)
    spec = importlib.util.spec_from_file_location(f"v_{tag}", path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return getattr(mod, name)

clamp = "    full_end = tl.maximum(tl.minimum(full_end, tiles_end), full_first)\n"
assert clamp in src
loops = re.findall(r"    for start_n in range\((tiles_first, full_first|full_first, full_end|full_end, tiles_end), BLOCK_N\):", src)
assert len(loops) == 3, loops
texts = {
    "as_generated": src,
    "scan_only": src.replace("range(tiles_first, full_first, BLOCK_N)", "range(N_SIZE + tiles_first, N_SIZE, BLOCK_N)")
                    .replace("range(full_first, full_end, BLOCK_N)", "range(N_SIZE + full_first, N_SIZE, BLOCK_N)")
                    .replace("range(full_end, tiles_end, BLOCK_N)", "range(N_SIZE + full_end, N_SIZE, BLOCK_N)"),
    "all_masked_loop": src.replace(clamp, clamp + "    full_first = tiles_end\n    full_end = tiles_end\n"),
    "all_full_loop": src.replace(clamp, clamp + "    full_first = tiles_first\n    full_end = tiles_end\n"),
}
configs = [(128, 64, 8, 3), (64, 64, 4, 3)] if not SMALL else [(32, 16, 1, 1)]
rows = []
for tag, text in texts.items():
    fn = variant(text, tag)
    for bm_, bn, w, s in configs:
        # the grid is programs over row tiles x heads: recompute for BLOCK_M
        n_prog = (-(-L // bm_)) * H
        call = lambda: fn[(n_prog,)](*args, BLOCK_M=bm_, BLOCK_N=bn, num_warps=w, num_stages=s)
        call()
        ms = bench_ms(call, dev) if not SMALL else 0.0
        err = (out.float() - ref.float()).abs().max().item()
        print(f"{tag:16s} {bm_}x{bn} w{w} s{s}: {ms:.3f} ms  (max diff vs kernel {err:.3g})", flush=True)
        rows.append({"variant": tag, "config": [bm_, bn, w, s], "ms": ms, "max_diff": err})

# tile statistics at 64x64: live / full / masked key tiles over all row tiles
T = 64
pos = torch.arange(L, device=dev)
rt = doc.view(-1, T); ct = doc.view(-1, T)
rlo, rhi = rt.min(1).values, rt.max(1).values
clo, chi = ct.min(1).values, ct.max(1).values
i = torch.arange(L // T, device=dev)
live = (rlo[:, None] <= chi[None, :]) & (clo[None, :] <= rhi[:, None]) & (i[None, :] <= i[:, None])
full = (rlo[:, None] == rhi[:, None]) & (clo[None, :] == chi[None, :]) & (rlo[:, None] == clo[None, :]) & (i[None, :] < i[:, None])
first = torch.where(live, i[None, :], L).min(1).values; last = torch.where(live, i[None, :], -1).max(1).values
in_range = (i[None, :] >= first[:, None]) & (i[None, :] <= last[:, None])
stats = {"tiles_in_range": int(in_range.sum()), "live": int(live.sum()), "full": int(full.sum()),
         "masked": int(in_range.sum() - full.sum()), "row_tiles": L // T}
print("64x64 tile stats (per head):", stats)
if not SMALL:
    bm = data_block_mask(_document_mod, doc, None, L, L)
    fc = torch.compile(lambda q, k, v, o=None: flex_attention(q[None], k[None], v[None], block_mask=bm, kernel_options=o)[0])
    for o in (None, dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)):
        fc(q, k, v, o)
        print("flex", o, bench_ms(lambda: fc(q, k, v, o), dev))
    print("flex block mask:", bm)
os.makedirs(os.environ.get("OUT", "/tmp") + "/results", exist_ok=True)
json.dump({"rows": rows, "tile_stats_64": stats}, open(os.environ.get("OUT", "/tmp") + "/results/doc_mask_split.json", "w"), indent=1)
