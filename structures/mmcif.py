"""mmCIF output through python-modelcif (the ModelCIF extension of PDBx/mmCIF).

:func:`modelcif_string` writes one model of one protein chain: the entity and its
polymer sequence, the atom sites (pLDDT in ``B_iso_or_equiv``, as in the PDB file),
pLDDT as ModelCIF local (per-residue) and global QA metrics, pTM as a global metric
when the preset has the TM head, the software (flashlight-fold, OpenFold) and the
modelling protocol, and the model name, which carries the random-weights warning, in
the title. The file reads back with ``modelcif.reader``, gemmi and Biopython's
``MMCIFParser`` (tests check all three).
"""
from __future__ import annotations

import io
from typing import Optional

import numpy as np


def _one_letter(residue: str) -> str:
    """OpenFold's one-letter code as ihm's alphabet names it (X: UNK)."""
    return residue if residue != "X" else "UNK"


def modelcif_string(
    name: str,
    sequence: str,
    positions: np.ndarray,
    atom_mask: np.ndarray,
    plddt: np.ndarray,
    title: str,
    ptm: Optional[float] = None,
    details: Optional[str] = None,
) -> str:
    """mmCIF text of one predicted chain.

    ``sequence`` is the folded sequence (one-letter codes, ``X`` for unknown),
    ``positions`` ``[N, 37, 3]`` and ``atom_mask`` ``[N, 37]`` in OpenFold's atom37
    order, ``plddt`` ``[N]`` (0-100). ``title`` is the ``_struct.title``.
    """
    import ihm
    import modelcif
    import modelcif.dumper
    import modelcif.model
    import modelcif.protocol
    import modelcif.qa_metric
    import modelcif.reference
    from openfold.np import residue_constants

    class _LocalPLDDT(modelcif.qa_metric.Local, modelcif.qa_metric.PLDDT):
        """Predicted lDDT-CA (0-100) of each residue"""

        name = "pLDDT"
        software = None

    class _GlobalPLDDT(modelcif.qa_metric.Global, modelcif.qa_metric.PLDDT):
        """Mean predicted lDDT-CA (0-100) over the residues"""

        name = "pLDDT"
        software = None

    class _GlobalPTM(modelcif.qa_metric.Global, modelcif.qa_metric.PTM):
        """Predicted TM-score (0-1)"""

        name = "pTM"
        software = None

    system = modelcif.System(title=title, id=name.upper()[:40] or "MODEL")
    alphabet = ihm.LPeptideAlphabet()
    chem = [alphabet[_one_letter(c)] for c in sequence]
    entity = modelcif.Entity(chem, description=f"{name} (predicted)")
    chain = modelcif.AsymUnit(entity, details=name, id="A", auth_seq_id_map=0)
    assembly = modelcif.Assembly([chain], name=name)
    model = modelcif.model.AbInitioModel(assembly, name=title)
    atom_names = residue_constants.atom_types  # atom37 order
    for i in range(len(sequence)):
        for j in np.flatnonzero(atom_mask[i] > 0.5):
            x, y, z = (float(v) for v in positions[i, j])
            atom = atom_names[j]
            model.add_atom(modelcif.model.Atom(
                asym_unit=chain, seq_id=i + 1, atom_id=atom, type_symbol=atom[0],
                x=round(x, 3), y=round(y, 3), z=round(z, 3), het=False,
                biso=round(float(plddt[i]), 2), occupancy=1.0,
            ))
    for i in range(len(sequence)):
        model.qa_metrics.append(_LocalPLDDT(chain.residue(i + 1), round(float(plddt[i]), 2)))
    model.qa_metrics.append(_GlobalPLDDT(round(float(np.mean(plddt)), 2)))
    if ptm is not None:
        model.qa_metrics.append(_GlobalPTM(round(float(ptm), 4)))

    software = [
        modelcif.Software(
            "flashlight-fold", "model building",
            "OpenFold accelerated by Flashlight's fused Triton attention kernels",
            None, "program", _version("flashlight"),
        ),
        modelcif.Software(
            "OpenFold", "model building", "AlphaFold2 reproduction in PyTorch",
            "https://github.com/aqlaboratory/openfold", "package", _version("openfold"),
        ),
    ]
    system.software.extend(software)
    for metric in (_LocalPLDDT, _GlobalPLDDT, _GlobalPTM):
        metric.software = software[1]
    target = modelcif.data.DataGroup([entity])
    protocol = modelcif.protocol.Protocol()
    protocol.steps.append(modelcif.protocol.ModelingStep(
        input_data=target, output_data=model,
        software=modelcif.SoftwareGroup(software), details=details,
    ))
    system.protocols.append(protocol)
    system.model_groups.append(modelcif.model.ModelGroup([model], name=name))
    buffer = io.StringIO()
    modelcif.dumper.write(buffer, [system])
    return buffer.getvalue()


def _version(package: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # noqa: BLE001 - the version is informative only
        return None
