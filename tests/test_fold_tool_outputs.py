"""flashlight-fold's confidence and structure files (CPU, tiny model_1_ptm, random weights).

One shared run folds a FASTA file and an A3M file (its query and MSA) with the TM head;
every file of a record folder is opened with the library that reads its format.
"""
import json
import os

import numpy as np
import pytest

pytest.importorskip("openfold")
pytest.importorskip("modelcif")

from flashlight.structures import relax  # noqa: E402
from flashlight.structures.testing import run_cli, write_fasta  # noqa: E402

SMALL = [
    "--num-blocks", "1", "--recycles", "0", "--warmup", "0",
    "--max-msa-clusters", "4", "--max-extra-msa", "4", "--chunk-size", "none",
]
SEQUENCES = {"alpha": "MKTAYIAKQRQISFVKSHFSRQ", "beta": "NLYIQWLKDGGPSSGRPPPS"}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ptm_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ptm")
    fasta = write_fasta(root / "alpha.fasta", {"alpha": SEQUENCES["alpha"]})
    a3m = root / "beta.a3m"
    a3m.write_text(f">beta query\n{SEQUENCES['beta']}\n>hit\n{SEQUENCES['beta'][:-2]}--\n")
    out = root / "out"
    extra = ["--relax"] if relax.missing() is None else []
    result = run_cli([fasta, a3m, "--out-dir", out, "--preset", "model_1_ptm", "--mmcif",
                      "--no-flashlight", *extra, *SMALL])
    assert result.returncode == 0, result.output
    return out, result


def _report(out, name):
    return json.loads((out / name / "latency.json").read_text())


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_confidence_json_has_plddt_ptm_and_pae(ptm_run, name):
    out, _ = ptm_run
    n = len(SEQUENCES[name])
    conf = json.loads((out / name / f"{name}_confidence.json").read_text())
    assert conf["schema"] == "flashlight.fold.confidence/1" and conf["id"] == name
    assert conf["random_weights"] is True and "RANDOM WEIGHTS" in conf["model"]
    plddt = np.array(conf["plddt"])
    assert plddt.shape == (n,) and np.isfinite(plddt).all() and ((plddt >= 0) & (plddt <= 100)).all()
    assert abs(conf["mean_plddt"] - plddt.mean()) < 0.01
    pae = np.array(conf["pae"])
    assert pae.shape == (n, n) and np.isfinite(pae).all()
    assert conf["max_pae"] == pytest.approx(31.75)  # AlphaFold's 64 bins of 0.5 A
    assert (pae >= 0).all() and (pae <= conf["max_pae"]).all() and pae.std() > 0
    assert 0.0 <= conf["ptm"] <= 1.0
    report = _report(out, name)
    assert report["ptm"] == pytest.approx(conf["ptm"], abs=1e-4)
    np.testing.assert_allclose(plddt, report["plddt"], atol=0.01)
    for key in ("pae_plot", "plddt_plot", "plot"):
        assert (out / name / report["outputs"][key]).read_bytes()[:8] == PNG
    assert sorted(os.listdir(out / name)) == sorted(report["outputs"].values())


def test_summary_lists_ptm(ptm_run):
    out, _ = ptm_run
    summary = json.loads((out / "summary.json").read_text())
    assert [r["id"] for r in summary["records"]] == ["alpha", "beta"]
    for entry in summary["records"]:
        assert entry["ptm"] == pytest.approx(_report(out, entry["id"])["ptm"])


def _cif(out, name):
    return str(out / name / f"{name}.cif")


def test_mmcif_reads_with_modelcif(ptm_run):
    import modelcif.reader

    out, _ = ptm_run
    report = _report(out, "alpha")
    with open(_cif(out, "alpha")) as handle:
        (system,) = modelcif.reader.read(handle)
    assert "RANDOM WEIGHTS" in system.title
    (entity,) = system.entities
    assert "".join(c.code_canonical for c in entity.sequence) == SEQUENCES["alpha"]
    (model,) = [m for group in system.model_groups for m in group]
    local = [m for m in model.qa_metrics if m.mode == "local"]
    assert [m.residue.seq_id for m in local] == list(range(1, len(SEQUENCES["alpha"]) + 1))
    np.testing.assert_allclose([m.value for m in local], report["plddt"], atol=0.01)
    glob = {m.name: m.value for m in model.qa_metrics if m.mode == "global"}
    assert glob["pLDDT"] == pytest.approx(report["mean_plddt"], abs=0.01)
    assert glob["pTM"] == pytest.approx(report["ptm"], abs=1e-3)  # written with 3 decimals
    assert {s.name for s in system.software} == {"flashlight-fold", "OpenFold"}


def test_mmcif_reads_with_gemmi_and_biopython(ptm_run):
    gemmi = pytest.importorskip("gemmi")
    from Bio.PDB import MMCIFParser, PDBParser

    out, _ = ptm_run
    structure = gemmi.read_structure(_cif(out, "beta"))
    (chain,) = structure[0]
    assert gemmi.one_letter_code([r.name for r in chain]) == SEQUENCES["beta"]
    from_pdb = PDBParser(QUIET=True).get_structure("p", str(out / "beta" / "beta.pdb"))
    from_cif = MMCIFParser(QUIET=True).get_structure("c", _cif(out, "beta"))
    pdb_atoms = {(a.get_parent().id[1], a.get_id()): a for a in from_pdb.get_atoms()}
    cif_atoms = {(a.get_parent().id[1], a.get_id()): a for a in from_cif.get_atoms()}
    assert pdb_atoms.keys() == cif_atoms.keys()
    assert structure[0].count_atom_sites() == len(cif_atoms)
    for key, atom in pdb_atoms.items():
        np.testing.assert_allclose(cif_atoms[key].coord, atom.coord, atol=2e-3)
        assert cif_atoms[key].get_bfactor() == pytest.approx(atom.get_bfactor(), abs=0.01)


def test_mmcif_without_modelcif_is_an_input_error(tmp_path):
    fasta = write_fasta(tmp_path / "q.fasta", {"q": "MKTAYI"})
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "modelcif.py").write_text("raise ImportError('blocked for the test')\n")
    from flashlight.structures.testing import cli_env

    env = cli_env(extra={"PYTHONPATH": str(blocker) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    result = run_cli([fasta, "--out-dir", tmp_path / "out", "--mmcif", *SMALL], env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --mmcif needs python-modelcif")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(relax.missing() is not None, reason=f"OpenMM/PDBFixer missing: {relax.missing()}")
def test_relax_writes_a_relaxed_structure(ptm_run):
    from Bio.PDB import PDBParser

    out, _ = ptm_run
    report = _report(out, "beta")
    assert report["options"]["relax"] is True and report["relax"]["platform"] == "CPU"
    path = out / "beta" / report["outputs"]["relaxed_pdb"]
    structure = PDBParser(QUIET=True).get_structure("r", str(path))
    assert len(list(structure.get_residues())) == len(SEQUENCES["beta"])
    assert any(a.element == "H" for a in structure.get_atoms())  # hydrogens added
