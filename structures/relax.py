"""Amber relaxation of a predicted structure (``flashlight-fold --relax``), with OpenMM.

AlphaFold's relaxation, written against OpenMM 8 directly: OpenFold 0.0.1's
``openfold.np.relax`` imports with OpenMM 8 but passes its minimiser tolerance in
kcal/mol where OpenMM 8 takes a force (kJ/mol/nm), so every minimisation it starts
fails. The steps are AlphaFold's: PDBFixer adds the missing heavy atoms (terminal
oxygens) and the hydrogens (pH 7), the Amber force field (``amber14-all.xml``, in
vacuum, hydrogen bonds constrained) is minimised with L-BFGS to a tolerance of
2.39 kcal/mol/A while harmonic restraints of 10 kcal/mol/A^2 hold every heavy atom to
its predicted position. AlphaFold's outer loop, which relaxes again with the residues
that still violate bond geometry unrestrained, is not run.

OpenMM and PDBFixer are optional (``FLASHLIGHT_SETUP_RELAX=1 bash scripts/setup.sh``):
:func:`missing` says what is absent, in one line.
"""
from __future__ import annotations

import io
import time
from typing import Optional, Sequence, Tuple

TOLERANCE_KCAL_PER_MOL_A = 2.39
STIFFNESS_KCAL_PER_MOL_A2 = 10.0
FORCE_FIELD = "amber14-all.xml"


def missing() -> Optional[str]:
    """Why ``--relax`` cannot run here (one line), or None when OpenMM and PDBFixer import."""
    absent = []
    for module in ("openmm", "pdbfixer"):
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - any import failure means unusable
            absent.append(module)
    if not absent:
        return None
    return (
        f"--relax needs OpenMM and PDBFixer ({' and '.join(absent)} cannot be imported); "
        "install them with FLASHLIGHT_SETUP_RELAX=1 bash scripts/setup.sh "
        "(or pip install openmm==8.6.1 pdbfixer==1.12.0)"
    )


def _platform(use_gpu: bool):
    import openmm

    if use_gpu:
        try:
            return openmm.Platform.getPlatformByName("CUDA")
        except Exception:  # noqa: BLE001 - no CUDA platform in this OpenMM build
            pass
    return openmm.Platform.getPlatformByName("CPU")


def _with_b_factors(pdb_text: str, per_residue: Sequence[float]) -> str:
    """``pdb_text`` with each ATOM's B-factor set to its residue's value (1-based numbers)."""
    lines = []
    for line in pdb_text.splitlines():
        if line.startswith(("ATOM", "HETATM")) and len(line) >= 66:
            number = int(line[22:26])
            if 1 <= number <= len(per_residue):
                line = f"{line[:60]}{per_residue[number - 1]:6.2f}{line[66:]}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def relax_pdb(
    pdb_text: str,
    plddt: Sequence[float],
    use_gpu: bool = False,
    max_iterations: int = 0,
) -> Tuple[str, dict]:
    """Relax the structure of ``pdb_text``; returns (relaxed PDB text, report).

    The relaxed PDB has hydrogens and carries ``plddt`` ``[N]`` (per residue, residues
    numbered 1..N as OpenFold writes them) in its B-factors. The report gives the
    OpenMM platform, the energies before and after (kcal/mol), the heavy-atom RMSD
    between them (A) and the time taken. ``max_iterations`` 0: until converged.
    """
    import numpy as np
    import openmm
    from openmm import app, unit
    from pdbfixer import PDBFixer

    start = time.perf_counter()
    fixer = PDBFixer(pdbfile=io.StringIO(pdb_text))
    fixer.findMissingResidues()
    fixer.missingResidues = {}  # residues without atoms (X) stay absent
    fixer.findMissingAtoms()
    fixer.addMissingAtoms()
    fixer.addMissingHydrogens(7.0)
    topology, positions = fixer.topology, fixer.positions

    system = app.ForceField(FORCE_FIELD).createSystem(
        topology, nonbondedMethod=app.NoCutoff, constraints=app.HBonds
    )
    restraint = openmm.CustomExternalForce("0.5 * k * ((x - x0)^2 + (y - y0)^2 + (z - z0)^2)")
    restraint.addGlobalParameter(
        "k", STIFFNESS_KCAL_PER_MOL_A2 * unit.kilocalories_per_mole / unit.angstroms**2
    )
    for name in ("x0", "y0", "z0"):
        restraint.addPerParticleParameter(name)
    heavy = [atom.index for atom in topology.atoms() if atom.element is not None and atom.element.symbol != "H"]
    for index in heavy:
        restraint.addParticle(index, positions[index].value_in_unit(unit.nanometers))
    system.addForce(restraint)

    platform = _platform(use_gpu)
    integrator = openmm.LangevinIntegrator(0, 0.01, 0.0)
    simulation = app.Simulation(topology, system, integrator, platform)
    simulation.context.setPositions(positions)

    def state():
        s = simulation.context.getState(getEnergy=True, getPositions=True)
        energy = s.getPotentialEnergy().value_in_unit(unit.kilocalories_per_mole)
        return energy, s.getPositions(asNumpy=True).value_in_unit(unit.angstroms)

    initial_energy, initial = state()
    simulation.minimizeEnergy(
        tolerance=TOLERANCE_KCAL_PER_MOL_A * unit.kilocalories_per_mole / unit.angstroms,
        maxIterations=max_iterations,
    )
    final_energy, final = state()
    if not np.isfinite(final).all() or not np.isfinite(final_energy):
        raise RuntimeError("relaxation diverged (non-finite energy or coordinates)")
    buffer = io.StringIO()
    app.PDBFile.writeFile(topology, final * unit.angstroms, buffer, keepIds=True)
    rmsd = float(np.sqrt(np.mean(np.sum((final[heavy] - initial[heavy]) ** 2, axis=-1))))
    report = {
        "platform": platform.getName(),
        "force_field": FORCE_FIELD,
        "tolerance_kcal_per_mol_A": TOLERANCE_KCAL_PER_MOL_A,
        "stiffness_kcal_per_mol_A2": STIFFNESS_KCAL_PER_MOL_A2,
        "initial_energy_kcal_per_mol": float(initial_energy),
        "final_energy_kcal_per_mol": float(final_energy),
        "heavy_atom_rmsd_A": rmsd,
        "atoms": topology.getNumAtoms(),
        "time_s": time.perf_counter() - start,
    }
    return _with_b_factors(buffer.getvalue(), list(plddt)), report
