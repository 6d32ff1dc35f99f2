"""flashlight-fold end to end on the bundled examples (CPU, tiny model, random weights)."""
import glob
import json
import os

import numpy as np
import pytest

pytest.importorskip("openfold")

from flashlight.structures.testing import EXAMPLE_FASTA, EXAMPLES, TINY_OPTIONS, run_cli  # noqa: E402


@pytest.fixture(scope="module")
def folded(tmp_path_factory):
    out = tmp_path_factory.mktemp("fold")
    result = run_cli(
        [EXAMPLE_FASTA, "--alignment-dir", EXAMPLES, "--out-dir", str(out), "--mmcif", *TINY_OPTIONS]
    )
    assert result.returncode == 0, result.output
    return out, result


def _pdb_plddt_per_residue(path):
    from Bio.PDB import PDBParser

    structure = PDBParser(QUIET=True).get_structure("x", path)
    residues = list(structure.get_residues())
    per_residue = []
    for residue in residues:
        factors = {atom.get_bfactor() for atom in residue}
        assert len(factors) == 1, f"atoms of {residue} carry different B-factors"
        per_residue.append(factors.pop())
    return residues, np.array(per_residue)


def test_every_record_gets_a_complete_folder(folded):
    out, _ = folded
    for record, length in (("trp_cage", 20), ("villin_hp36", 36)):
        folder = out / record
        names = sorted(os.listdir(folder))
        assert names == sorted(
            ["latency.json", "latency.png", f"{record}.pdb", f"{record}.cif",
             f"{record}_confidence.json", f"{record}_plddt.png"]
        ), names
        report = json.loads((folder / "latency.json").read_text())
        assert report["record"]["length"] == length
        assert (folder / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not glob.glob(str(out / "**" / "*.tmp"), recursive=True)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["id"] for r in summary["records"]] == ["trp_cage", "villin_hp36"]
    assert all(r["status"] == "ok" for r in summary["records"])


def test_pdb_parses_and_b_factors_are_plddt(folded):
    out, _ = folded
    for record in ("trp_cage", "villin_hp36"):
        report = json.loads((out / record / "latency.json").read_text())
        residues, b_factors = _pdb_plddt_per_residue(out / record / f"{record}.pdb")
        assert len(residues) == report["record"]["length"]
        np.testing.assert_allclose(b_factors, report["plddt"], atol=0.006)
        assert abs(b_factors.mean() - report["mean_plddt"]) < 0.01


def test_mmcif_parses_with_the_same_b_factors(folded):
    from Bio.PDB import MMCIFParser

    out, _ = folded
    structure = MMCIFParser(QUIET=True).get_structure("x", str(out / "villin_hp36" / "villin_hp36.cif"))
    _, from_pdb = _pdb_plddt_per_residue(out / "villin_hp36" / "villin_hp36.pdb")
    from_cif = [next(iter(r)).get_bfactor() for r in structure.get_residues()]
    np.testing.assert_allclose(from_cif, from_pdb)
    assert "RANDOM WEIGHTS" in (out / "villin_hp36" / "villin_hp36.cif").read_text()


def test_random_weights_are_labelled_everywhere(folded):
    out, result = folded
    assert "RANDOM WEIGHTS" in result.stderr
    pdb_text = (out / "trp_cage" / "trp_cage.pdb").read_text()
    assert pdb_text.startswith("REMARK 250 flashlight-fold model_1: RANDOM WEIGHTS seed 0")
    report = json.loads((out / "trp_cage" / "latency.json").read_text())
    assert report["model"]["random_weights"] is True
    assert "RANDOM WEIGHTS" in report["model"]["label"]


def test_msa_is_used_when_present(folded):
    out, _ = folded
    villin = json.loads((out / "villin_hp36" / "latency.json").read_text())
    trp = json.loads((out / "trp_cage" / "latency.json").read_text())
    assert villin["record"]["msa_depth"] == 6
    assert villin["record"]["msa"][0].endswith("villin_hp36.a3m")
    assert trp["record"]["msa"] is None and trp["record"]["msa_depth"] == 1


def test_flashlight_fallback_is_reported_not_silent(folded):
    out, result = folded
    # The CLI ran on CPU without TRITON_INTERPRET: Flashlight cannot run there.
    assert "WARNING: Flashlight is not active" in result.stderr
    assert "TRITON_INTERPRET" in result.stderr
    report = json.loads((out / "trp_cage" / "latency.json").read_text())
    assert report["flashlight"]["requested"] is True
    assert report["flashlight"]["active"] is False
    assert "TRITON_INTERPRET" in report["flashlight"]["reason"]
    assert list(report["runs"]) == ["stock"]


def test_terminal_table(folded):
    _, result = folded
    assert "end to end" in result.stdout
    for name in ("msa_att_row", "tri_att_end", "pair_transition", "model (median)", "warm-up"):
        assert name in result.stdout
    assert "summary.json" in result.stdout


def test_require_flashlight_fails_clearly(tmp_path):
    fasta = os.path.join(EXAMPLES, "miniproteins.fasta")
    result = run_cli([fasta, "--out-dir", str(tmp_path), "--require-flashlight", *TINY_OPTIONS])
    assert result.returncode == 2
    assert "Flashlight is unavailable" in result.stderr
    assert "TRITON_INTERPRET" in result.stderr


def test_quiet_prints_no_tables(tmp_path):
    fasta = tmp_path / "one.fasta"
    fasta.write_text(">tiny\nNLYIQWLKDG\n")
    result = run_cli(
        [str(fasta), "--out-dir", str(tmp_path / "out"), "--quiet", "--no-flashlight", "--no-plot", "--warmup", "0", *TINY_OPTIONS]
    )
    assert result.returncode == 0, result.output
    assert result.stdout == ""
    assert "RANDOM WEIGHTS" in result.stderr  # warnings survive --quiet
    assert (tmp_path / "out" / "tiny" / "tiny.pdb").exists()
