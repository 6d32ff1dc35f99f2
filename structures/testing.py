"""Helpers for testing ``flashlight-fold``: tiny settings, CLI runs, weight files.

Used by the repository's ``tests/test_fold_*.py``; handy for users checking an
installation too (``run_cli(["structures/examples/miniproteins.fasta", ...])``).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Dict, Iterable, List, Optional

import numpy as np

# Options that make a fold take seconds on a CPU: one or two Evoformer blocks, no
# recycling, small MSA padding, no chunking, a single timed run.
TINY_OPTIONS = [
    "--num-blocks", "2",
    "--recycles", "0",
    "--repeats", "1",
    "--max-msa-clusters", "8",
    "--max-extra-msa", "8",
    "--chunk-size", "none",
]
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples")
EXAMPLE_FASTA = os.path.join(EXAMPLES, "miniproteins.fasta")


@dataclasses.dataclass
class CliResult:
    """Exit code and output of one ``flashlight-fold`` run."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout and stderr together."""
        return self.stdout + self.stderr


def cli_env(interpret: bool = False, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment for a CLI subprocess: one CPU thread, Triton interpreter on or off."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["TRITON_INTERPRET"] = "1" if interpret else "0"
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra or {})
    return env


def run_cli(
    args: Iterable[str],
    interpret: bool = False,
    timeout: float = 600,
    cwd: Optional[str] = None,
    launcher: Optional[List[str]] = None,
    env: Optional[Dict[str, str]] = None,
) -> CliResult:
    """Run ``python -m flashlight.structures ARGS`` (or ``launcher + ARGS``) in a subprocess."""
    command = (launcher or [sys.executable, "-m", "flashlight.structures"]) + list(args)
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env or cli_env(interpret),
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def write_fasta(path: str, records: Dict[str, str]) -> str:
    """Write ``{id: sequence}`` as FASTA and return ``path``."""
    with open(path, "w") as handle:
        for record_id, sequence in records.items():
            handle.write(f">{record_id}\n{sequence}\n")
    return path


# -- AlphaFold parameter files ---------------------------------------------------------


def _to_alphafold_layout(tensor, param_type) -> np.ndarray:
    """Invert OpenFold's import transformation for one tensor (any head split works)."""
    from openfold.utils.import_weights import ParamType

    w = tensor.detach().float().cpu().numpy()
    if param_type is ParamType.LinearWeight:
        return np.swapaxes(w, -1, -2)
    if param_type is ParamType.LinearWeightMHA:
        # OpenFold: [*, in, H, C] -> [*, H*C, in]; back as [*, in, H*C, 1]
        return np.swapaxes(w, -1, -2)[..., None]
    if param_type in (ParamType.LinearMHAOutputWeight, ParamType.LinearWeightOPM):
        # OpenFold: [*, A, B, out] -> [*, out, A*B]; back as [*, A*B, 1, out]
        t = np.swapaxes(w, -1, -2)
        return t.reshape(t.shape[:-1] + (1, t.shape[-1]))
    if param_type is ParamType.LinearBiasMHA:
        return w[..., None]
    return w


def export_alphafold_params(model, path: str, preset: str = "model_1") -> str:
    """Write ``model``'s weights as an AlphaFold ``.npz`` (AlphaFold's parameter names).

    The inverse of ``openfold.utils.import_weights.import_jax_weights_``: loading the
    file into a model of the same configuration reproduces ``model``'s parameters.
    """
    from openfold.utils import import_weights

    flat = import_weights.process_translation_dict(
        import_weights.generate_translation_dict(model, preset)
    )
    arrays = {}
    for key, param in flat.items():
        if param.stacked:
            arrays[key] = np.stack([_to_alphafold_layout(p, param.param_type) for p in param.param])
        else:
            arrays[key] = _to_alphafold_layout(param.param, param.param_type)
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    return path


# -- small structures --------------------------------------------------------------------


def _place(a, b, c, bond: float, angle: float, torsion: float) -> np.ndarray:
    """The atom bonded to ``c`` at ``bond`` A, angle b-c-d ``angle`` and torsion a-b-c-d
    ``torsion`` (degrees): the natural extension reference frame."""
    angle, torsion = np.radians(angle), np.radians(torsion)
    bc = (c - b) / np.linalg.norm(c - b)
    n = np.cross(b - a, bc)
    n /= np.linalg.norm(n)
    d2 = bond * np.array([-np.cos(angle), np.sin(angle) * np.cos(torsion), np.sin(angle) * np.sin(torsion)])
    frame = np.stack([bc, np.cross(n, bc), n], axis=1)
    return c + frame @ d2


def backbone_pdb(length: int, phi: float = -57.0, psi: float = -47.0, noise: float = 0.0, seed: int = 0) -> str:
    """PDB text of a poly-alanine backbone (N, CA, C, O; no CB, no hydrogens) with ideal
    bond lengths and angles and the given torsions (default: an alpha helix), each atom
    moved by Gaussian ``noise`` (A). For relaxation tests: PDBFixer adds the rest."""
    rng = np.random.default_rng(seed)
    n, ca, c = np.array([0.0, 1.458, 0.0]), np.zeros(3), np.array([1.525, 0.0, 0.0])
    chain = [(n, ca, c)]
    for _ in range(length - 1):
        n_next = _place(chain[-1][0], chain[-1][1], chain[-1][2], 1.329, 116.2, psi)
        ca_next = _place(chain[-1][1], chain[-1][2], n_next, 1.458, 121.7, 180.0)
        c_next = _place(chain[-1][2], n_next, ca_next, 1.525, 111.2, phi)
        chain.append((n_next, ca_next, c_next))
    lines, serial = [], 1
    for i, (n, ca, c) in enumerate(chain):
        if i + 1 < len(chain):
            o = _place(chain[i + 1][0], ca, c, 1.231, 120.5, 180.0)
        else:
            o = _place(n, ca, c, 1.231, 120.5, psi + 180.0)
        for name, xyz in (("N", n), ("CA", ca), ("C", c), ("O", o)):
            x, y, z = xyz + rng.normal(0.0, noise, 3)
            lines.append(f"ATOM  {serial:5d}  {name:<3s} ALA A{i + 1:4d}    {x:8.3f}{y:8.3f}{z:8.3f}"
                         f"  1.00 50.00           {name[0]}")
            serial += 1
    return "\n".join(lines + ["TER", "END"]) + "\n"
