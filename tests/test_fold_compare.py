"""--compare: stock and Flashlight side by side, their deviation, and honest fallbacks."""
import json

import pytest
import torch

pytest.importorskip("openfold")

import flashlight  # noqa: E402
from flashlight.structures import fold as fold_module  # noqa: E402
from flashlight.structures.fold import FlashlightUnavailable, Folder, FoldOptions  # noqa: E402
from flashlight.structures.inputs import Record  # noqa: E402
from flashlight.structures.testing import TINY_OPTIONS, run_cli, write_fasta  # noqa: E402

SEQUENCE = "NLYIQWLKDGGPSSGRPPPS"


def test_cli_compare_reports_deviation(tmp_path):
    fasta = write_fasta(tmp_path / "q.fasta", {"trp": SEQUENCE})
    out = tmp_path / "out"
    result = run_cli([str(fasta), "--out-dir", str(out), "--compare", *TINY_OPTIONS])
    assert result.returncode == 0, result.output
    report = json.loads((out / "trp" / "latency.json").read_text())
    assert list(report["runs"]) == ["stock", "flashlight"]
    comparison = report["comparison"]
    for key in ("max_atom_deviation_A", "rms_atom_deviation_A", "max_plddt_difference", "mean_plddt_difference"):
        assert comparison[key] >= 0
    assert comparison["atoms"] > len(SEQUENCE) * 4
    # No GPU and no TRITON_INTERPRET here: both sides are stock, and every output says so.
    assert comparison["flashlight_active"] is False
    assert comparison["max_atom_deviation_A"] == 0.0
    assert "both runs used stock OpenFold" in comparison["note"]
    assert "--compare compares stock OpenFold with itself" in result.stderr
    assert "stock vs flashlight: max atom deviation" in result.stdout
    assert "flashlight ms (inactive: stock)" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["records"][0]["model_s"]) == {"stock", "flashlight"}


def test_cli_compare_runs_flashlight_kernels_in_the_interpreter(tmp_path):
    """The real patch, kernels run by Triton's interpreter: a 3-residue, 1-block model."""
    fasta = write_fasta(tmp_path / "q.fasta", {"tri": "MKT"})
    out = tmp_path / "out"
    tiny = ["--num-blocks", "1", "--recycles", "0", "--repeats", "1", "--warmup", "0",
            "--max-msa-clusters", "5", "--max-extra-msa", "1", "--chunk-size", "none", "--no-plot"]
    result = run_cli([str(fasta), "--out-dir", str(out), "--compare", *tiny], interpret=True)
    assert result.returncode == 0, result.output
    report = json.loads((out / "tri" / "latency.json").read_text())
    assert report["flashlight"]["active"] is True, report["flashlight"]
    assert "patched" in report["flashlight"]["details"]
    assert report["end_to_end"]["variant"] == "flashlight"
    comparison = report["comparison"]
    assert comparison["flashlight_active"] is True and comparison["note"] is None
    assert comparison["max_atom_deviation_A"] < 1e-2
    assert comparison["max_plddt_difference"] < 1e-2
    assert "Flashlight is not active" not in result.stderr


class _FakePatch:
    """Stands in for flashlight.patch_openfold: perturbs the patched model's MSA row attention."""

    def __init__(self, fail_on_run=False):
        self.fail_on_run = fail_on_run
        self.patched = []

    def patch(self, model, **_):
        self.patched.append(model)
        block = model.evoformer.blocks[0]
        with torch.no_grad():
            block.msa_att_row.mha.linear_o.weight.mul_(3.0)
        if self.fail_on_run:
            def broken(*args, **kwargs):
                raise RuntimeError("kernel launch failed")

            block.msa_att_row.forward = broken
        return "patched 1 module"

    def unpatch(self, model):
        block = model.evoformer.blocks[0]
        if "forward" in vars(block.msa_att_row):
            del block.msa_att_row.forward
        with torch.no_grad():
            block.msa_att_row.mha.linear_o.weight.div_(3.0)
        return 1


@pytest.fixture
def fake_flashlight(monkeypatch):
    def install(fail_on_run=False):
        fake = _FakePatch(fail_on_run)
        monkeypatch.setattr(flashlight, "patch_openfold", fake.patch)
        monkeypatch.setattr(flashlight, "unpatch_openfold", fake.unpatch)
        monkeypatch.setattr(fold_module, "_flashlight_unusable", lambda device: None)
        return fake

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield install
    torch.set_num_threads(saved)


def _options(tmp_path, **kw):
    base = dict(
        out_dir=str(tmp_path), num_blocks=1, recycles=0, warmup=1, repeats=1, chunk_size=None,
        max_msa_clusters=6, max_extra_msa=2, plot=True,
    )
    base.update(kw)
    return FoldOptions(**base)


RECORD = Record(id="trp", description="Trp-cage", sequence=SEQUENCE, source="-", index=1)


def test_compare_measures_a_real_difference(tmp_path, fake_flashlight):
    fake = fake_flashlight()
    warnings = []
    folder = Folder(_options(tmp_path, compare=True), warn=warnings.append)
    assert folder.status.active and folder.status.details == "patched 1 module"
    assert fake.patched == [folder.variants["flashlight"]]
    assert folder.variants["flashlight"] is not folder.stock  # stock stays stock
    report = folder.fold(RECORD)
    comparison = report["comparison"]
    assert comparison["flashlight_active"] is True and comparison["note"] is None
    assert comparison["max_atom_deviation_A"] > 0
    assert 0 < comparison["rms_atom_deviation_A"] <= comparison["max_atom_deviation_A"]
    assert report["end_to_end"]["variant"] == "flashlight"
    assert warnings == []


def test_failure_on_first_run_falls_back_loudly(tmp_path, fake_flashlight):
    fake_flashlight(fail_on_run=True)
    warnings = []
    folder = Folder(_options(tmp_path), warn=warnings.append)
    assert list(folder.variants) == ["flashlight"]
    report = folder.fold(RECORD)
    assert list(report["runs"]) == ["stock"]
    assert report["flashlight"]["active"] is False
    assert "first Flashlight run: RuntimeError: kernel launch failed" in report["flashlight"]["reason"]
    assert any("folding with stock OpenFold instead" in w for w in warnings)
    assert "forward" not in vars(folder.stock.evoformer.blocks[0].msa_att_row)  # unpatched


def test_failure_with_compare_still_compares(tmp_path, fake_flashlight):
    fake_flashlight(fail_on_run=True)
    warnings = []
    folder = Folder(_options(tmp_path, compare=True, plot=False), warn=warnings.append)
    report = folder.fold(RECORD)
    assert list(report["runs"]) == ["stock", "flashlight"]
    assert report["comparison"]["flashlight_active"] is False
    assert report["comparison"]["max_atom_deviation_A"] == 0.0
    assert any("compares stock OpenFold with itself" in w for w in warnings)
    # stock's run stands in Flashlight's place, marked, so no report reads it as Flashlight's
    assert "kernel launch failed" in report["runs"]["flashlight"]["fell_back"]
    assert "fell_back" not in report["runs"]["stock"]
    from bench.fold_product import summarise

    row = summarise(report)
    assert "speedup" not in row and "kernel launch failed" in row["fell_back"]


def test_required_flashlight_raises(tmp_path, monkeypatch):
    def refuse(model, **_):
        raise ValueError("no attention modules")

    monkeypatch.setattr(flashlight, "patch_openfold", refuse)
    monkeypatch.setattr(fold_module, "_flashlight_unusable", lambda device: None)
    with pytest.raises(FlashlightUnavailable, match="patching the model: ValueError: no attention modules"):
        Folder(_options(tmp_path, require_flashlight=True), warn=print)


def test_compare_times_modules_in_one_more_pass_without_autograd(tmp_path, fake_flashlight, monkeypatch):
    """On a GPU a comparison adds a pass with synchronised module starts
    ([Note: synchronised module spans]); forced here on the CPU, where the rest is the same."""
    fake_flashlight()
    monkeypatch.setattr(fold_module.Folder, "_module_pass", lambda self: True)
    folder = Folder(_options(tmp_path, compare=True, plot=False), warn=lambda _: None)
    grad_modes = []
    for model in folder.variants.values():
        model.evoformer.blocks[0].register_forward_hook(lambda *_: grad_modes.append(torch.is_grad_enabled()))
    report = folder.fold(RECORD)
    # warm-up, timed pass and module pass of each variant, none recording a graph
    assert grad_modes == [False] * 6
    for run in report["runs"].values():
        blocks = run["modules_synchronised"]["blocks"]
        assert len(blocks) == 1 and all(s > 0 for s in blocks[0]["modules"].values())
    assert folder.runs_per_record() == 2 * (1 + 1 + 1)


def test_a_plain_fold_compiles_in_its_pass_and_timed_folds_warm_up(tmp_path, fake_flashlight, monkeypatch):
    """[Note: compiling in the background during a fold's pass]: a plain Flashlight fold
    runs no warm-up and compiles in its one pass, unless the caches hold the fold
    ([Note: skipping the warm-up when the caches are warm]); folds that time several
    passes warm up where they compile, comparisons always."""
    from flashlight import settings

    from flashlight import prepare
    from flashlight.structures import fold as fold_module

    fake_flashlight()
    order = []  # the preparing thread starts before the model is built
    monkeypatch.setattr(prepare, "start", lambda start=prepare.start: order.append("prepare") or start())
    monkeypatch.setattr(fold_module, "build_model",
                        lambda *a, build=fold_module.build_model: order.append("build") or build(*a))
    with settings.override(cache_dir=str(tmp_path / "cache")):
        folder = Folder(_options(tmp_path / "out", warmup=None, plot=False), warn=lambda _: None)
        assert "stock" not in folder.variants and order[:2] == ["prepare", "build"]
        totals, iterations = [], []

        def fold(record):
            report = folder.fold(record, on_recycle=lambda: iterations.append(1), on_total=totals.append)
            run = report["runs"]["flashlight"]
            assert run["prepare_at_first_pass"]["thread"] in ("running", "done")  # in latency.json
            return report["warmup_runs"], run["compiled_in_pass"], run["warmup_compile"]["mode"]

        first, second = fold(RECORD), fold(RECORD)
        assert first == (0, True, "background") and second[:2] == (0, False)
        vars(folder.options)["repeats"] = 2  # timed passes: a warm-up where the fold compiles
        try:
            shorter = Record(id="short", description="", sequence=SEQUENCE[:-3], source="-", index=2)
            timed_again, timed_new = fold(RECORD), fold(shorter)
        finally:
            vars(folder.options)["repeats"] = 1
        # the progress total counts the warm-up only where it runs
        assert totals == [1, 1, 2, 3] and len(iterations) == 7
        assert timed_again[:2] == (0, False) and timed_new[:2] == (1, False)
        comparing = Folder(_options(tmp_path / "cmp", warmup=None, plot=False, compare=True), warn=lambda _: None)
        compared = comparing.fold(RECORD)
    assert compared["warmup_runs"] == 1 and all(len(r["warmup_s"]) == 1 for r in compared["runs"].values())
    assert not any(r["compiled_in_pass"] for r in compared["runs"].values())
