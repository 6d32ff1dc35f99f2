"""The benchmark's peers on the CPU: every Flex / SDPA formulation computes its variant, the
hand-written peers' adapters put the catalog's tensors in each peer's documented layout
(checked through float64 stand-ins of the peers, which need a GPU), the OpenFold
attention adapters reproduce stock modules, and the product, long-chain and fidelity
parts record and resume (the GPU work replaced by stand-ins)."""
import importlib.util
import io
import json
import lzma
import math
import os
import pathlib
import sys
import time

import pytest
import torch

from bench import formulations, kernels, peers
from bench.variants import VARIANTS

# ---------------------------------------------------------------------------- stand-ins


def ref_ds4sci(q, k, v, biases):
    """DS4Sci_EvoformerAttention's documented computation: [B, N, L, H, c], scale c**-0.5."""
    B, N, L, H, c = q.shape
    b1, b2 = (list(biases) + [None, None])[:2]
    if b1 is not None:
        assert tuple(b1.shape) == (B, N, 1, 1, L)
    if b2 is not None:
        assert tuple(b2.shape) == (B, 1, H, L, L)
    qt, kt, vt = (t.transpose(-2, -3) for t in (q, k, v))  # [B, N, H, L, c]
    a = qt @ kt.transpose(-1, -2) * c ** -0.5
    a = a + (0 if b1 is None else b1) + (0 if b2 is None else b2)
    return (torch.softmax(a, -1) @ vt).transpose(-2, -3)


def ref_cueq(q, k, v, bias, mask, scale):
    """cuEquivariance's triangle_attention: q, k, v [B, N, H, Q, c], bias [B, 1, H, Q, K],
    bool keep-mask [B, N, 1, 1, K]."""
    assert q.dim() == 5 and bias.shape[1] == 1 and mask.dtype == torch.bool
    a = q @ k.transpose(-1, -2) * scale + bias
    a = a.masked_fill(~mask, float("-inf"))
    return torch.softmax(a, -1) @ v


def ref_trifast(q, k, v, bias, mask):
    """trifast's triangle_attention: q, k, v [B, H, N, N, c], bias [B, H, N, N], mask
    [B, N, N] True = masked, scale c**-0.5."""
    c = q.shape[-1]
    a = q @ k.transpose(-1, -2) * c ** -0.5 + bias[:, :, None]  # [B, H, I, J, K]
    a = a.masked_fill(mask[:, None, :, None, :], float("-inf"))
    return torch.softmax(a, -1) @ v


@pytest.fixture
def stand_ins(monkeypatch):
    monkeypatch.setattr(peers, "_ds4sci", ref_ds4sci)
    monkeypatch.setattr(peers, "_cueq", lambda: ref_cueq)
    monkeypatch.setattr(peers, "_trifast", lambda: ref_trifast)


def _inputs(variant, shape=None, seed=3):
    gen = torch.Generator().manual_seed(seed)
    args = variant.make_inputs(shape or variant.default_shape, torch.float64, "cpu", gen)
    return args, kernels.reference(variant, args)


# ---------------------------------------------------------------------------- formulations


@pytest.mark.parametrize("impl", ["flex", "sdpa"])
def test_every_formulation_computes_its_variant(impl):
    checked = 0
    for name in (*kernels.EVOFORMER, *kernels.CORE):
        v = VARIANTS[name]
        args, ref = _inputs(v)
        for form, fn in formulations.forms(v, impl).items():
            # a form compiling its own call is checked through its eager twin (same arithmetic)
            got = fn(*args, compile_inside=None) if formulations.compiles_itself(fn) else fn(*args)
            assert torch.isfinite(got).all(), (name, form)
            torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9, msg=lambda m: f"{name} {form}: {m}")
            checked += 1
    assert checked >= 9


def test_flash_forms_pass_the_flash_backend_and_are_unavailable_here():
    forms = formulations.forms(VARIANTS["msa_row_pair_bias"], "flex_flash")
    assert set(forms) == {"bias_contiguous", "qkv_contiguous", "compiled_call", "bias_input"}
    assert formulations.compiles_itself(forms["compiled_call"]) and not formulations.compiles_itself(forms["bias_contiguous"])
    own = formulations.forms(VARIANTS["msa_row_pair_bias"], "flex")["compiled_call"]
    assert kernels.make_impl(VARIANTS["msa_row_pair_bias"], "flex", "cpu", None, own) is own  # not compiled whole
    assert all(f.keywords["kernel_options"] == {"BACKEND": "FLASH"} for f in forms.values())
    assert "catalog" in formulations.forms(VARIANTS["evoformer_core"], "flex_flash")
    assert "CUDA" in formulations.flash_availability() or "flash-attn-4" in formulations.flash_availability()


def test_a_run_for_an_implementation_that_cannot_run_here_measures_nothing(tmp_path, capsys):
    """``--require``: bench/run_all.sh's FLASH part exits with its own status (the part
    stays to do) instead of recording every cell as unavailable."""
    out = tmp_path / "k.json"
    argv = ["--smoke", "--variants", "vanilla", "--impls", "flex_flash,eager", "--out", str(out), "--quiet"]
    assert kernels.main(argv + ["--require", "flex_flash"]) == kernels.EXIT_UNAVAILABLE
    assert not out.exists() and "flex_flash cannot run here" in capsys.readouterr().err
    assert kernels.availability("eager") is None


def test_the_fastest_accurate_formulation_wins():
    results = {"catalog": {"status": "ok", "ms": 2.0, "max_rel_err": 1e-3},
               "fast_but_wrong": {"status": "ok", "ms": 0.5, "max_rel_err": 0.3},
               "nan": {"status": "ok", "ms": 0.1, "max_rel_err": 1e-3, "nonfinite": 4},
               "broken": {"status": "error"},
               "fast": {"status": "ok", "ms": 1.0, "max_rel_err": 2e-3}}
    assert formulations.pick(results) == "fast"
    assert formulations.pick({"broken": {"status": "error"}}) is None


def test_kernels_records_the_winning_formulation(tmp_path):
    out = tmp_path / "k.json"
    assert kernels.main(["--device", "cpu", "--smoke", "--quiet", "--variants", "msa_row_pair_bias,evoformer_core",
                         "--impls", "sdpa,ds4sci,trifast", "--out", str(out)]) == kernels.EXIT_COMPLETE
    cells = {(c["variant"], c["impl"]): c for c in json.loads(out.read_text())["cells"]}
    sdpa = cells[("msa_row_pair_bias", "sdpa")]
    assert sdpa["status"] == "ok" and sdpa["formulation"] in ("catalog", "qkv_contiguous")
    assert set(sdpa["formulations"]) == {"catalog", "qkv_contiguous"}
    assert all(f["max_rel_err"] < 1e-4 for f in sdpa["formulations"].values())
    assert sdpa["ms"] == sdpa["formulations"][sdpa["formulation"]]["ms"]
    ds = cells[("msa_row_pair_bias", "ds4sci")]
    assert ds["status"] == "unavailable" and "bf16" in ds["message"]  # fp32 smoke cells
    assert "square" in cells[("evoformer_core", "trifast")]["message"]


# ---------------------------------------------------------------------------- peer adapters


@pytest.mark.parametrize("peer", ["ds4sci", "cuequivariance", "trifast"])
def test_peer_adapters_compute_the_variant_in_the_peers_layout(peer, stand_ins):
    checked = 0
    for name, fn in peers.ADAPTERS[peer].items():
        v = VARIANTS[name]
        shape = dict(v.default_shape)
        if peer == "ds4sci":  # it takes more than 16 positions
            shape.update({k: max(shape[k], 17) for k in ("N", "L", "S") if k in shape})
        if name == "evoformer_core" and peer == "trifast":
            shape["N"] = shape["L"]
        assert peers.not_applicable(peer, name, shape, torch.bfloat16) is None, name
        args, ref = _inputs(v, shape)
        got = fn(*args)
        assert got.shape == ref.shape, name
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9, msg=lambda m: f"{peer} {name}: {m}")
        checked += 1
    assert checked == len(peers.ADAPTERS[peer]) >= 3


def test_ds4sci_is_unavailable_without_a_gpu_and_says_why():
    assert "CUDA" in peers.availability("ds4sci")
    assert peers.not_applicable("ds4sci", "msa_column", {"S": 16, "L": 40}, torch.bfloat16)
    assert peers.not_applicable("ds4sci", "triangle_start", {"N": 40}, torch.float32)
    assert "head widths up to 64" in peers.not_applicable("ds4sci", "msa_row_pair_bias",
                                                          {"S": 256, "L": 256, "c": 128}, torch.bfloat16)
    assert peers.not_applicable("ds4sci", "msa_row_pair_bias", {"S": 256, "L": 256, "c": 64}, torch.bfloat16) is None


def test_ds4sci_finds_a_finished_build_and_packs_it(tmp_path, monkeypatch):
    import tarfile

    from bench import ds4sci

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert ds4sci.built_library() is None  # nothing built yet
    folder = ds4sci.extensions_dir()
    assert str(folder).startswith(str(tmp_path / "ext")) and folder.name == "evoformer_attn"
    (folder / "build.ninja").write_text("rule x\n")
    (folder / "evoformer_attn.so").write_bytes(b"\x7fELF")
    assert ds4sci.built_library() == folder / "evoformer_attn.so"
    (folder / "kernels.o").write_bytes(os.urandom(3000))  # incompressible: three parts of 1 KiB
    monkeypatch.setattr(ds4sci, "PART_BYTES", 1024)
    parts = ds4sci.pack(tmp_path / "out")
    assert [p.name for p in parts] == [f"{ds4sci.PACK_NAME}.xz.part{i:02d}" for i in range(len(parts))]
    assert len(parts) >= 3 and all(p.stat().st_size <= 1024 for p in parts)
    joined = lzma.decompress(b"".join(p.read_bytes() for p in parts))  # as gpu_run.sh: cat | xz -d | tar -x
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        assert sorted(tar.getnames()) == ["evoformer_attn", "evoformer_attn/build.ninja",
                                          "evoformer_attn/evoformer_attn.so", "evoformer_attn/kernels.o"]


def test_ds4sci_reads_architectures_as_numbers_and_imports_deepspeed_after_openfold(monkeypatch):
    """DeepSpeed's builder reads ``9.0a`` as a number (and fails): the suffix goes, in the
    build's environment and in this process. DeepSpeed's own folder joins ``sys.path``
    only after OpenFold decided it has no DeepSpeed (its 0.0.1 calls an API DeepSpeed 0.19
    lacks)."""
    from bench import ds4sci

    assert ds4sci.plain_arch_list("8.0;9.0a 10.0a+PTX") == "8.0;9.0 10.0+PTX"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.setenv("FLASHLIGHT_DEEPSPEED_SITE", "/nonexistent/site-deepspeed")
    env = ds4sci._build_env()
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0" and env["PYTHONPATH"].endswith("/nonexistent/site-deepspeed")
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ImportError):
        ds4sci._import_deepspeed_entry()
    assert sys.path[-1] == "/nonexistent/site-deepspeed" and os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0"
    if importlib.util.find_spec("openfold") is not None:
        assert "openfold.model.primitives" in sys.modules


def test_ds4sci_build_stops_cleanly_on_time_and_packs_a_finished_build(tmp_path, monkeypatch):
    import time as _time

    from bench import ds4sci

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("FLASHLIGHT_GPU_OUT", str(tmp_path / "out"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ds4sci, "BUILD_SCRIPT", "import time; time.sleep(60)")
    started = _time.monotonic()
    assert ds4sci.build(max_s=17) == 3 and _time.monotonic() - started < 15
    so = ds4sci.extensions_dir() / "evoformer_attn.so"
    monkeypatch.setattr(ds4sci, "BUILD_SCRIPT", f"open({str(so)!r}, 'wb').write(b'so')")
    assert ds4sci.build(max_s=60) == 0
    assert (tmp_path / "out" / f"{ds4sci.PACK_NAME}.xz.part00").stat().st_size > 0
    monkeypatch.setattr(ds4sci, "BUILD_SCRIPT", "raise SystemExit(1)")
    so.unlink()
    assert ds4sci.build(max_s=60) == 1


# ---------------------------------------------------------------------------- OpenFold adapters


def _fake_peer(q, k, v, biases):
    """OpenFold's attention from the split biases, through the DS4Sci stand-in (float64)."""
    from bench import openfold_peers

    lead, (q_len, heads, _) = q.shape[:-3], q.shape[-3:]
    mask, pair = openfold_peers.split_biases(biases, lead, heads, q_len, k.shape[-3])
    rows = [openfold_peers._rows(t, lead) for t in (q, k, v)]
    return ref_ds4sci(*rows, [mask, pair]).reshape(q.shape)


def test_openfold_attention_through_a_peer_matches_stock_and_unpatches():
    pytest.importorskip("openfold")
    from openfold.model.msa import MSARowAttentionWithPairBias
    from openfold.model.triangular_attention import TriangleAttention

    from bench import openfold_peers

    torch.manual_seed(0)
    row = MSARowAttentionWithPairBias(c_m=16, c_z=8, c_hidden=4, no_heads=2).double()
    tri = TriangleAttention(c_in=8, c_hidden=4, no_heads=2, starting=True).double()
    for module in (row, tri):
        for p in module.parameters():
            torch.nn.init.normal_(p, std=0.3)
    m, z = torch.randn(1, 3, 18, 16, dtype=torch.float64), torch.randn(1, 18, 18, 8, dtype=torch.float64)
    msa_mask = (torch.rand(1, 3, 18) > 0.2).double()
    pair_mask = (torch.rand(1, 18, 18) > 0.2).double()
    msa_mask[..., 0] = pair_mask[..., 0] = 1
    with torch.no_grad():
        want = (row(m, z, mask=msa_mask), tri(z, mask=pair_mask))
        patched = [*openfold_peers.patch_attention(row, "ds4sci", _fake_peer),
                   *openfold_peers.patch_attention(tri, "ds4sci", _fake_peer)]
        got = (row(m, z, mask=msa_mask), tri(z, mask=pair_mask))
    assert openfold_peers.summary(patched) == {"modules": 2, "peer_calls": 2, "stock_calls": {}}
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
    assert openfold_peers.unpatch_attention(row) + openfold_peers.unpatch_attention(tri) == 2
    assert "forward" not in vars(row.mha) and "forward" not in vars(tri.mha)

    # a call the peer rejects runs the stock forward and is counted, with its reason
    def rejects(*args):
        raise RuntimeError("head width not supported")

    (fwd,) = openfold_peers.patch_attention(tri, "ds4sci", rejects)
    with torch.no_grad():
        torch.testing.assert_close(tri(z, mask=pair_mask), want[1])
    assert fwd.calls == 0 and list(fwd.fallbacks.values()) == [1] and "head width" in next(iter(fwd.fallbacks))


# ---------------------------------------------------------------------------- the product part


def _fake_fold(tmp_path: pathlib.Path) -> pathlib.Path:
    """A stand-in for flashlight-fold writing a latency.json like the real one."""
    script = tmp_path / "fake_fold.py"
    script.write_text('''
import json, os, sys
args = sys.argv[1:]
out = args[args.index("--out-dir") + 1]
rid = os.path.basename(args[0])[:-len(".fasta")]
cold = not os.listdir(os.environ["FLASHLIGHT_CACHE_DIR"]) if os.path.isdir(os.environ["FLASHLIGHT_CACHE_DIR"]) else True
os.makedirs(os.environ["FLASHLIGHT_CACHE_DIR"], exist_ok=True)
open(os.path.join(os.environ["FLASHLIGHT_CACHE_DIR"], "k"), "w").write("x")
first = 30.0 if cold else 3.0
def run(model_s, warmup=True):
    block = {"index": 0, "total_s": model_s, "modules": {"msa_att_row": model_s / 4, "tri_att_start": model_s / 8}}
    return {"warmup_s": [first] if warmup else [], "runs_s": [model_s], "chunk_size": None,
            "warmup": [{"model_s": first, "stages": {"evoformer": first / 2}}],
            "cuda_graphs": [{"module": "EvoformerStack", "recordings": 1, "replays": 3, "failures": []}],
            "steady": {"model_s": model_s, "stages": {"evoformer": model_s}, "blocks": [block, block]},
            "modules_synchronised": {"model_s": model_s, "blocks": [block, dict(block, modules={"msa_att_row": 9.0})]}}
runs = {"stock": run(4.0, warmup="--compare" in args), "flashlight": run(2.0 if "--dtype" not in args else 1.0)}
if "--compare" not in args:  # one variant alone: stock without a warm-up
    runs = {k: v for k, v in runs.items() if (k == "stock") == ("--no-flashlight" in args)}
report = {"runs": runs,
          "comparison": {"max_atom_deviation_A": 0.01}, "record": {"msa_depth": 7 if "--alignment-dir" in args else 1}}
os.makedirs(os.path.join(out, rid), exist_ok=True)
json.dump(report, open(os.path.join(out, rid, "latency.json"), "w"))
x = 1.5 if "--no-flashlight" in args else 2.25  # one atom, 0.75 A apart between the variants
open(os.path.join(out, rid, rid + ".pdb"), "w").write(
    "ATOM      1  CA  ALA A   1    %8.3f%8.3f%8.3f  1.00 50.00           C\\nEND\\n" % (x, 0.0, 0.0))
''')
    return script


def test_fold_product_runs_cold_then_warm_and_resumes(tmp_path, monkeypatch):
    from bench import fold_product

    script = _fake_fold(tmp_path)
    monkeypatch.setattr(fold_product, "launcher", lambda: ([sys.executable, str(script)], "fake"))
    out = tmp_path / "fp.json"
    argv = ["--lengths", "20", "--msa", "deep,single", "--dtypes", "fp32,bf16", "--depth", "7",
            "--work-dir", str(tmp_path / "work"), "--out", str(out), "--quiet", "--run-estimate-s", "1"]
    assert fold_product.main(argv) == fold_product.EXIT_COMPLETE
    rows = {fold_product.row_key(r): r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows.values())
    cold, warm = rows[(20, "deep", "fp32", "cold")], rows[(20, "deep", "fp32", "warm")]
    assert cold["flashlight_first_call_s"] == 30.0 and warm["flashlight_first_call_s"] == 3.0  # caches filled
    assert cold["speedup"] == 2.0 and rows[(20, "deep", "bf16", "cold")]["speedup"] == 4.0
    assert cold["flashlight_modules_s"] == {"msa_att_row": 1.0, "tri_att_start": 0.5}  # both blocks summed
    assert cold["flashlight_modules_synchronised_s"]["msa_att_row"] == 9.5
    assert cold["flashlight_modules_synchronised_blocks_s"]["msa_att_row"] == [0.5, 9.0]  # one block's outlier
    assert cold["flashlight_warmup_stages_s"] == {"evoformer": 15.0}  # the first call's stages
    assert cold["stock_cuda_graphs"][0]["replays"] == 3
    assert cold["msa_depth"] == 7 and rows[(20, "single", "fp32", "cold")]["msa_depth"] == 1
    assert cold["command"][0] == "flashlight-fold" and "--compare" in cold["command"]
    assert "--dtype" not in cold["command"] and "bf16" in rows[(20, "deep", "bf16", "warm")]["command"]
    assert (tmp_path / "fp.csv").read_text().count("\n") == 9
    assert fold_product.main(argv) == fold_product.EXIT_COMPLETE  # resumes: nothing to do
    assert len(json.loads(out.read_text())["runs"]) == 1


def test_fold_product_solo_row_times_each_variant_alone_and_cold(tmp_path, monkeypatch):
    from bench import fold_product

    script = _fake_fold(tmp_path)
    monkeypatch.setattr(fold_product, "launcher", lambda: ([sys.executable, str(script)], "fake"))
    out = tmp_path / "fp.json"
    argv = ["--lengths", "20", "--msa", "single", "--dtypes", "fp32", "--rows", "cold,warm,solo", "--work-dir", str(tmp_path / "w"),
            "--out", str(out), "--quiet", "--run-estimate-s", "1"]
    assert fold_product.main(argv) == fold_product.EXIT_COMPLETE
    rows = {fold_product.row_key(r): r for r in json.loads(out.read_text())["rows"]}
    solo = rows[(20, "single", "fp32", "solo")]
    # stock alone: no warm-up, its cold pass; Flashlight alone: its cold warm-up plus its pass
    assert solo["stock_first_fold_s"] == 4.0 and solo["flashlight_first_fold_s"] == 32.0
    assert solo["first_fold_ratio"] == 8.0 and "--compare" not in solo["command"]
    # then each alone again, in fresh processes finding the caches the first ones filled
    assert solo["stock_second_fold_s"] == 4.0 and solo["flashlight_second_fold_s"] == 5.0
    assert solo["second_fold_ratio"] == 1.25
    # three such pairs by default (one process's host speed is noisy): each kept, the median quoted
    assert solo["stock_again_fold_s"] == [4.0] * 3 and solo["again_ratios"] == [1.25] * 3
    assert solo["flashlight_second_first_fold_s"] == 5.0  # a user's second run alone
    assert solo["max_abs_diff"] == pytest.approx(0.75)  # between the two structures written
    assert rows[(20, "single", "fp32", "warm")]["flashlight_first_call_s"] == 3.0  # the pair kept its caches
    data = json.loads(out.read_text())
    data["rows"] = [r for r in data["rows"] if r["cache"] != "warm"]
    out.write_text(json.dumps(data))
    assert fold_product.main(argv) == fold_product.EXIT_COMPLETE  # the pair runs again, together
    rows = {fold_product.row_key(r): r for r in json.loads(out.read_text())["rows"]}
    assert rows[(20, "single", "fp32", "warm")]["flashlight_first_call_s"] == 3.0
    assert rows[(20, "single", "fp32", "cold")]["flashlight_first_call_s"] == 30.0


def test_fold_product_compares_warmup_compile_modes_in_one_call(tmp_path, monkeypatch):
    from bench import fold_product

    script = _fake_fold(tmp_path)
    script.write_text(script.read_text().replace(
        '"flashlight": run(2.0', '"flashlight": run(2.5 if os.environ.get("FLASHLIGHT_WARMUP_COMPILE") == "background" else 2.0'))
    monkeypatch.setattr(fold_product, "launcher", lambda: ([sys.executable, str(script)], "fake"))
    out = tmp_path / "fp.json"
    argv = ["--lengths", "20", "--msa", "single", "--dtypes", "fp32", "--warmup-compile", "inline,background",
            "--repeats", "3", "--work-dir", str(tmp_path / "work"), "--out", str(out), "--quiet",
            "--run-estimate-s", "1"]
    assert fold_product.main(argv) == fold_product.EXIT_COMPLETE
    rows = {fold_product.row_key(r): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {(20, "single", "fp32", cache, mode) for cache in ("cold", "warm")
                         for mode in ("inline", "background")}
    assert rows[(20, "single", "fp32", "cold", "inline")]["flashlight_model_s"] == 2.0
    assert rows[(20, "single", "fp32", "warm", "background")]["flashlight_model_s"] == 2.5
    assert rows[(20, "single", "fp32", "warm", "background")]["flashlight_first_call_s"] == 3.0  # its own caches
    assert rows[(20, "single", "fp32", "cold", "inline")]["command"][-2:] == ["--repeats", "3"]
    assert fold_product.main(argv) == fold_product.EXIT_COMPLETE  # resumes: nothing to do
    assert len(json.loads(out.read_text())["runs"]) == 1


def test_fold_product_stops_without_time_for_a_cold_and_warm_pair(tmp_path):
    from bench import fold_product

    out = tmp_path / "fp.json"
    assert fold_product.main(["--lengths", "20", "--msa", "single", "--dtypes", "fp32", "--out", str(out),
                              "--work-dir", str(tmp_path), "--quiet", "--max-minutes", "1"]) == fold_product.EXIT_INCOMPLETE
    assert json.loads(out.read_text())["rows"] == []


def test_fold_product_reruns_a_timed_out_row_and_sizes_rows_by_measured_processes(tmp_path, monkeypatch):
    """A row that ran out of time is not a result: the next call runs it again and the
    file keeps one row per key. A row starts only where its processes fit in the time
    left, each expected to take the longest process measured at its length."""
    from bench import fold_product

    script = _fake_fold(tmp_path)
    monkeypatch.setattr(fold_product, "launcher", lambda: ([sys.executable, str(script)], "fake"))
    out = tmp_path / "fp.json"
    timed_out = {"length": 20, "msa": "single", "dtype": "fp32", "cache": "warm", "status": "timeout", "wall_s": 42.0}
    cold = {"length": 20, "msa": "single", "dtype": "fp32", "cache": "cold", "status": "ok", "wall_s": 30.0}
    out.write_text(json.dumps({"schema": "flashlight-bench-fold-product/1", "runs": [], "rows": [cold, timed_out]}))
    argv = ["--lengths", "20", "--msa", "single", "--dtypes", "fp32", "--work-dir", str(tmp_path / "w"),
            "--out", str(out), "--quiet", "--run-estimate-s", "1"]
    assert fold_product.main(argv) == fold_product.EXIT_COMPLETE
    rows = json.loads(out.read_text())["rows"]
    assert sorted((r["cache"], r["status"]) for r in rows) == [("cold", "ok"), ("warm", "ok")]
    # expected seconds per process: the longest measured at the length, else scaled from the default
    solo = {"length": 512, "cache": "solo", "status": "ok", "stock_process_wall_s": 70.0,
            "flashlight_second_process_wall_s": 80.0}
    assert fold_product.process_estimate([solo, cold], 512, 60.0) == 80.0
    assert fold_product.process_estimate([{**solo, "stock_again_process_wall_s": [75.0, 90.0]}], 512, 60.0) == 90.0
    assert fold_product.process_estimate([solo, timed_out], 20, 60.0) == 60.0
    assert fold_product.process_estimate([], 1024, 60.0) == 240.0
    monkeypatch.setenv("FLASHLIGHT_BUDGET_END", str(time.time() + 8))  # less than 4 processes and the margin
    assert fold_product.main(argv + ["--rows", "solo"]) == fold_product.EXIT_INCOMPLETE
    assert all(r["cache"] != "solo" for r in json.loads(out.read_text())["rows"])


def test_a_failing_fold_is_a_recorded_result(tmp_path, monkeypatch):
    from bench import fold_product

    monkeypatch.setattr(fold_product, "launcher", lambda: ([sys.executable, "-c",
                        "import sys; print('error: bad record', file=sys.stderr); sys.exit(2)"], "fake"))
    out = tmp_path / "fp.json"
    assert fold_product.main(["--lengths", "20", "--msa", "single", "--dtypes", "fp32", "--out", str(out),
                              "--work-dir", str(tmp_path), "--quiet", "--run-estimate-s", "1"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["status"] for r in rows] == ["error", "error"]
    assert "exit status 2" in rows[0]["message"] and "bad record" in rows[0]["message"]


# ---------------------------------------------------------------------------- long chains, fidelity


def test_fidelity_deviation_is_zero_for_the_same_prediction_and_measures_atoms():
    from bench.fidelity import deviation

    pos = torch.randn(5, 37, 3)
    mask = (torch.rand(5, 37) > 0.5).float()
    mask[0, 0] = 1
    ref = {"pos": pos, "plddt": torch.rand(5) * 100, "mask": mask}
    same = deviation(ref, ref)
    assert same["rms_atom_deviation_A"] == 0 and same["max_plddt_difference"] == 0 and same["finite"]
    moved = {**ref, "pos": pos + torch.tensor([0.0, 3.0, 4.0])}  # every atom 5 Å away, same frame
    got = deviation(ref, moved)
    assert math.isclose(got["rms_atom_deviation_A"], 5.0, rel_tol=1e-6)
    assert math.isclose(got["max_atom_deviation_A"], 5.0, rel_tol=1e-6) and got["atoms"] == int(mask.sum())
    assert not deviation(ref, {**ref, "plddt": ref["plddt"] * float("nan")})["finite"]
    single = torch.randn(5, 8)
    trunk = deviation({**ref, "single": single}, {**ref, "single": single * 1.5})
    assert math.isclose(trunk["single_relative_rms"], 0.5, rel_tol=1e-6) and "pair_relative_rms" not in trunk


def test_long_chain_records_out_of_memory_and_resumes(tmp_path, monkeypatch):
    pytest.importorskip("openfold")
    from bench import long_chain

    def fake_cell(args, n, mode, device):
        if mode == "stock_chunked":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        if mode == "stock_lma":
            return {"ms": 9000.0, "first_call_s": 9.0, "iters": 1, "chunk_size": 4, "chunk_tuner": True}
        return {"ms": 1000.0 * n / 1024, "first_call_s": 1.0, "iters": 1}

    monkeypatch.setattr(long_chain, "run_cell", fake_cell)
    out = tmp_path / "lc.json"
    argv = ["--n-res", "2048", "--modes", "flashlight,stock_chunked", "--out", str(out), "--device", "cpu"]
    assert long_chain.main(argv) == long_chain.EXIT_COMPLETE
    cells = {c["mode"]: c for c in json.loads(out.read_text())["cells"]}
    assert cells["flashlight"]["status"] == "ok" and cells["flashlight"]["ms"] == 2000.0
    assert cells["stock_chunked"]["status"] == "oom" and "80.00 GiB" in cells["stock_chunked"]["message"]
    assert long_chain.main(argv) == long_chain.EXIT_COMPLETE
    assert len(json.loads(out.read_text())["cells"]) == 2

    # a chunked cell from before OpenFold's chunk-size tuner was kept on is measured again
    data = json.loads(out.read_text())
    data["cells"].append({"n_res": 2048, "mode": "stock_lma", "run": 0, "status": "ok", "ms": 150000.0,
                          "chunk_size": 4})
    out.write_text(json.dumps(data))
    argv[argv.index("flashlight,stock_chunked")] = "flashlight,stock_chunked,stock_lma"
    assert long_chain.main(argv) == long_chain.EXIT_COMPLETE
    lma = [c for c in json.loads(out.read_text())["cells"] if c["mode"] == "stock_lma"]
    assert [c.get("chunk_tuner") for c in lma] == [None, True] and lma[-1]["ms"] == 9000.0


def test_run_all_lists_the_new_parts_first():
    import subprocess

    root = pathlib.Path(__file__).parents[1]
    listed = subprocess.run(["bash", "bench/run_all.sh", "--list"], cwd=root, capture_output=True, text=True,
                            check=True).stdout.split("\n")
    names = [line.split()[0] for line in listed if line.strip()]
    assert names[:23] == ["tune-configs-fold", "fold-cold-quick-builds", "kernels-fp32-three-products",
                          "launcher-beside-ab2-on", "launcher-beside-ab2-off", "static-launch-ab-off",
                          "static-launch-ab-on", "launcher-beside-ab-off", "launcher-beside-ab-on",
                          "capture-process-ab-off", "capture-process-ab-on", "warm-first-fold",
                          "warm-first-fold-bf16", "new-forms", "fold-product", "fold-warmup-ab", "kernels-general",
                          "training-kernels", "training-step", "training-profile", "tune-configs", "kernels-core",
                          "kernels-headlines-evoformer"]
    for part in ("kernels-headlines-lm", "ds4sci-build", "kernels-ds4sci", "fold-noise", "evoformer-peers-256", "fidelity", "long-chain",
                 "kernels-flex-flash"):
        assert part in names


def test_evoformer_peer_mode_runs_the_stack_through_the_peer(tmp_path, monkeypatch):
    """``--modes ds4sci`` patches every attention of the stack (the peer replaced by its
    float stand-in), records what the peer computed and matches stock (float32 tightly,
    bf16 loosely); DS4Sci itself is unavailable in TF32, with the reason."""
    pytest.importorskip("openfold")
    from openfold.model.model import AlphaFold

    from bench import evoformer, openfold_peers

    assert "bf16" in openfold_peers.availability("ds4sci", "tf32")
    assert openfold_peers.availability("stock", "tf32") is None

    def build(config, seed, device):
        torch.manual_seed(seed)
        model = AlphaFold(config)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.05)
        return model.eval().to(device)

    monkeypatch.setattr(evoformer, "build_model", build)
    monkeypatch.setattr(openfold_peers, "availability", lambda mode, dtype: None)
    monkeypatch.setitem(openfold_peers.ATTENTION, "ds4sci", _fake_peer)
    out = tmp_path / "evo.json"
    assert evoformer.main(["--smoke", "--scopes", "stack", "--modes", "ds4sci", "--dtypes", "tf32,bf16",
                           "--blocks", "1", "--n-res", "20", "--out", str(out)]) == evoformer.EXIT_COMPLETE
    cells = {c["dtype"]: c for c in json.loads(out.read_text())["cells"]}
    for dtype, bound in (("tf32", 1e-4), ("bf16", 1.0)):
        cell = cells[dtype]
        assert cell["status"] == "ok", cell
        assert cell["peer"]["modules"] == 4 and cell["peer"]["peer_calls"] >= 4 and cell["peer"]["stock_calls"] == {}
        assert cell["max_abs_diff_vs_stock"] < bound, (dtype, cell["max_abs_diff_vs_stock"])


def test_evoformer_graph_modes_and_a_peer_that_computed_nothing():
    """``-graphs`` modes name their base mode; a peer cell whose every call ran stock is an
    error (its times are stock's), not a result under the peer's name."""
    from bench import evoformer_modes, openfold_peers

    assert evoformer_modes.base_mode("cueq-graphs") == ("cueq", True)
    assert evoformer_modes.base_mode("flashlight") == ("flashlight", False)
    assert {"stock-graphs", "flashlight-graphs", "ds4sci-graphs", "cueq-graphs"} <= set(evoformer_modes.MODES)

    class Forward:
        def __init__(self, calls, fallbacks):
            self.calls, self.fallbacks = calls, fallbacks

    rec = {"_peer_forwards": [Forward(0, {"ds4sci failed: ValueError": 3})]}
    openfold_peers.record_summary(rec)
    assert rec["status"] == "error" and "ds4sci failed" in rec["message"]
    rec = {"_peer_forwards": [Forward(2, {"fewer than 17 positions": 1})]}
    openfold_peers.record_summary(rec)
    assert "status" not in rec and rec["peer"]["peer_calls"] == 2


def test_an_end_to_end_cell_that_disagrees_with_stock_is_wrong():
    """A cell far from stock (a peer's kernels launched outside a replayed CUDA graph, say)
    or with NaN is not a time; agreement as measured is."""
    from bench.evoformer_modes import disagreement

    assert disagreement({"max_abs_diff_vs_stock": 0.22}, "stack", "bf16") is None
    assert disagreement({"max_abs_diff_vs_stock": 1.7, "finite": True}, "model", "bf16") is None
    assert "differs from stock" in disagreement({"max_abs_diff_vs_stock": 836.0}, "stack", "bf16")
    assert "differs from stock" in disagreement({"max_abs_diff_vs_stock": 0.5}, "stack", "tf32")
    assert "NaN" in disagreement({"max_abs_diff_vs_stock": float("nan"), "finite": False}, "model", "bf16")
    assert disagreement({}, "stack", "tf32") is None  # stock itself: nothing to compare


def test_gpu_samples_summarise_the_clock_and_throttling_while_a_fold_runs(tmp_path, monkeypatch):
    """bench.common.gpu_samples runs ``nvidia-smi --loop-ms`` beside the block (here a
    stand-in printing two samples, one throttled by the power cap) and summarises it; with
    no nvidia-smi it yields None."""
    from bench import common

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '1980, 650.5, 61, 0x0000000000000000'\n"
                    "echo '1755, 699.0, 66, 0x0000000000000004'\necho 'garbage'\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with common.gpu_samples(interval_ms=10) as sampled:
        import time

        time.sleep(0.3)  # the stand-in prints its samples
    gpu = sampled["gpu"]
    assert gpu["samples"] == 2 and (gpu["sm_mhz_min"], gpu["sm_mhz_max"]) == (1755.0, 1980.0)
    assert gpu["power_w_max"] == 699.0 and gpu["temperature_c_max"] == 66.0
    assert gpu["throttled_share"] == 0.5 and gpu["throttle_reasons"] == ["0x4"]
    assert common.summarise_gpu_samples(["1400, 100, 40, 0x1"])["throttled_share"] == 0.0  # idle is no throttle
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with common.gpu_samples() as sampled:
        pass
    assert sampled["gpu"] is None
