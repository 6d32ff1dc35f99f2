"""The files of a folded record: the structure (PDB, and mmCIF through python-modelcif),
its Amber relaxation (OpenMM), the confidences with their plots, and ``latency.json``
last, written into a fresh folder that then replaces the record's folder whole
(:func:`~flashlight.structures.outputs.record_folder`)."""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from flashlight.structures import confidence, outputs
from flashlight.structures.inputs import Record, safe_name
from flashlight.structures.mmcif import modelcif_string

log = logging.getLogger("flashlight.fold")


class RecordFiles:
    """Writes a record's files for :class:`~flashlight.structures.fold.Folder`, from its
    ``options``, ``info`` (the model), ``status`` (whether Flashlight is active),
    ``environment``, ``device`` and ``warn``."""

    def _write_record(self, record: Record, pred: dict, report: dict, wall_start: float) -> dict:
        """Write the record's files into a fresh folder, ``latency.json`` last, then move
        it to ``<out_dir>/<safe name>`` whole (see :func:`outputs.record_folder`)."""
        opts = self.options
        log.info(f"record {record.id!r}: writing {os.path.join(opts.out_dir, safe_name(record.id))}")
        with outputs.record_folder(opts.out_dir, safe_name(record.id)) as folder:
            start = time.perf_counter()
            files = self._write_structures(record, folder, pred)
            if opts.relax:
                files.update(self._relax(record, folder, files["pdb"], pred, report))
            files.update(self._write_confidence(record, folder, pred))
            if opts.plot:
                title = f"{record.id} ({record.length} residues) on {self.environment['device_name']}: {self.info.label()}"
                labels = {} if self.status.active else {"flashlight": "flashlight (inactive: stock)"}
                outputs.plot_latency(
                    os.path.join(folder, "latency.png"),
                    title,
                    {k: v["steady"] for k, v in report["runs"].items()},
                    labels,
                )
                files["plot"] = "latency.png"
            e2e = report["end_to_end"]
            e2e["write_s"] = time.perf_counter() - start
            e2e["total_s"] = e2e["features_s"] + e2e["model_s"] + e2e["write_s"]
            e2e["wall_s"] = time.perf_counter() - wall_start
            report["outputs"] = {**files, "latency": "latency.json"}
            outputs.write_json(os.path.join(folder, "latency.json"), report)
        return report

    def _relax(self, record: Record, folder: str, pdb_name: str, pred: dict, report: dict) -> dict:
        """``<name>_relaxed.pdb`` (Amber, OpenMM); a failure is a warning, in ``report``."""
        from flashlight.structures.relax import relax_pdb

        log.info(f"record {record.id!r}: Amber relaxation")
        with open(os.path.join(folder, pdb_name), "r", encoding="utf-8") as handle:
            pdb_text = handle.read()
        try:
            relaxed, report["relax"] = relax_pdb(pdb_text, pred["plddt"], use_gpu=self.device.type == "cuda")
        except Exception as err:  # noqa: BLE001 - the prediction is kept without it
            report["relax"] = {"error": f"{type(err).__name__}: {err}"}
            self.warn(f"warning: record {record.id!r}: relaxation failed ({report['relax']['error']})")
            return {}
        name = safe_name(record.id) + "_relaxed.pdb"
        outputs.write_atomic(os.path.join(folder, name), relaxed)
        info = report["relax"]
        log.info(f"  relaxed on {info['platform']} in {info['time_s']:.1f} s: energy "
                 f"{info['initial_energy_kcal_per_mol']:.4g} -> {info['final_energy_kcal_per_mol']:.4g} kcal/mol")
        return {"relaxed_pdb": name}

    def _write_confidence(self, record: Record, folder: str, pred: dict) -> dict:
        """``<name>_confidence.json`` and, unless ``plot`` is off, the pLDDT and PAE plots."""
        name = safe_name(record.id)
        files = {"confidence": name + "_confidence.json"}
        payload = confidence.confidence_report(
            record.id, pred, self.info.label(), self.info.random_weights
        )
        outputs.write_json(os.path.join(folder, files["confidence"]), payload)
        if self.options.plot:
            title = f"{record.id}: {self.info.label()}"
            files["plddt_plot"] = name + "_plddt.png"
            confidence.plot_plddt(os.path.join(folder, files["plddt_plot"]), pred["plddt"], title)
            if pred["pae"] is not None:
                files["pae_plot"] = name + "_pae.png"
                confidence.plot_pae(
                    os.path.join(folder, files["pae_plot"]), pred["pae"], float(pred["max_pae"]), title
                )
        return files

    def _write_structures(self, record: Record, folder: str, pred: dict) -> dict:
        from openfold.np import residue_constants

        aatype = np.array(
            [residue_constants.restype_order_with_x.get(c, residue_constants.restype_num) for c in record.sequence],
            dtype=np.int64,
        )
        if self.info.random_weights:
            source = f"RANDOM WEIGHTS seed {self.info.seed}, NOT A PREDICTION"
        else:
            source = f"weights {os.path.basename(self.info.weights)}"
        remark = f"250 flashlight-fold {self.info.preset}: {source}"[:73]  # 80 columns
        pdb_text = outputs.pdb_string(aatype, pred["positions"], pred["atom_mask"], pred["plddt"], remark)
        name = safe_name(record.id)
        files = {"pdb": name + ".pdb"}
        outputs.write_atomic(os.path.join(folder, files["pdb"]), pdb_text)
        if self.options.mmcif:
            files["mmcif"] = name + ".cif"
            text = modelcif_string(
                name, record.sequence, pred["positions"], pred["atom_mask"], pred["plddt"],
                f"flashlight-fold: {self.info.label()}", ptm=pred["ptm"],
                details=" ".join(self.options.command or []) or None,
            )
            outputs.write_atomic(os.path.join(folder, files["mmcif"]), text)
        return files
