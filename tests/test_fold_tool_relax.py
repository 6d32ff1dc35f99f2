"""Amber relaxation (``flashlight-fold --relax``) on the CPU, and its absence."""
import os

import numpy as np
import pytest

from flashlight.structures import relax
from flashlight.structures.testing import backbone_pdb, cli_env, run_cli, write_fasta

needs_openmm = pytest.mark.skipif(
    relax.missing() is not None, reason=f"OpenMM/PDBFixer missing: {relax.missing()}"
)


@needs_openmm
def test_relaxation_lowers_the_energy_of_a_distorted_helix():
    import io

    from Bio.PDB import PDBParser

    pdb_text = backbone_pdb(8, noise=0.15, seed=3)
    plddt = np.linspace(40.0, 90.0, 8)
    relaxed, report = relax.relax_pdb(pdb_text, plddt, use_gpu=False)
    assert report["platform"] == "CPU"
    assert np.isfinite(report["final_energy_kcal_per_mol"])
    assert report["final_energy_kcal_per_mol"] < report["initial_energy_kcal_per_mol"] - 1.0
    # restrained: heavy atoms stay near the prediction
    assert 0.0 < report["heavy_atom_rmsd_A"] < 1.0
    structure = PDBParser(QUIET=True).get_structure("r", io.StringIO(relaxed))
    residues = list(structure.get_residues())
    assert len(residues) == 8
    assert all("CB" in r and "H" in r or r.id[1] == 1 for r in residues)  # atoms added
    for residue, value in zip(residues, plddt):
        np.testing.assert_allclose([a.get_bfactor() for a in residue], value, atol=0.01)


def test_relax_without_openmm_is_an_input_error(tmp_path):
    fasta = write_fasta(tmp_path / "q.fasta", {"q": "MKTAYI"})
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "openmm.py").write_text("raise ImportError('blocked for the test')\n")
    env = cli_env(extra={"PYTHONPATH": str(blocker) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    result = run_cli([fasta, "--out-dir", tmp_path / "out", "--relax", "--no-flashlight"], env=env)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --relax needs OpenMM and PDBFixer (openmm and pdbfixer cannot be imported)")
    assert "FLASHLIGHT_SETUP_RELAX=1" in line and not (tmp_path / "out").exists()
