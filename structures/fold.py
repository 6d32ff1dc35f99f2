"""Folding records with stock OpenFold and/or Flashlight, timing every layer.

:class:`Folder` builds the model once (or twice for ``compare``: a stock copy and a
Flashlight-patched copy) and folds records one at a time, by default once each: a
record's MSA is used at its own depth ([Note: folding at the MSA's depth] in
:mod:`~flashlight.structures.features`), chunking is off unless memory runs out
([Note: chunking only where memory needs it] in :mod:`~flashlight.structures.models`),
Flashlight compiles during that pass ([Note: compiling in the background during a fold's
pass] in :mod:`~flashlight.structures.compile_pass`), and a short warm-up pass runs only
where passes are timed against each other (``compare``, ``repeats`` above one:
:meth:`Folder._warmup_plan`). ``repeats`` timed passes (default one) give the
element-wise medians reported. It writes the structure, the plot and ``latency.json``
(with the command line and options) into a fresh folder that then replaces
``<out_dir>/<safe name of the record id>/`` whole, and returns the report.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import platform
import time
import warnings
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from flashlight import capture_worker, compile_workers, prepare, settings
from flashlight.integrations import openfold_graphs
from flashlight.structures import compile_pass, confidence
from flashlight.structures import features as feature_builder
from flashlight.structures import warm_folds
from flashlight.structures.inputs import Record
from flashlight.structures.record_files import RecordFiles
from flashlight.structures.models import (
    DTYPES,
    ModelInfo,
    PatchStatus,
    apply_flashlight,
    build_model,
    chunk_size_tuners,
    make_config,
    preset_chunk_size,
    remove_flashlight,
    set_chunk_size,
    tuned_chunk_sizes,
)
from flashlight.structures.timing import FrozenHeap, LayerTimer, kernel_profile, median_timing

SCHEMA = "flashlight.fold.latency/1"
log = logging.getLogger("flashlight.fold")
_NOISY_OPENFOLD_WARNING = ".*non-tuple sequence for multidimensional indexing.*"


class FlashlightUnavailable(RuntimeError):
    """Flashlight was required (``--require-flashlight``) but cannot run."""


@dataclasses.dataclass
class FoldOptions:
    """Everything that decides how records are folded (the CLI's options)."""

    out_dir: str = "fold_out"
    preset: str = "model_1"
    params: Optional[str] = None
    device: str = "cpu"
    dtype: str = "fp32"
    flashlight: bool = True
    compare: bool = False
    require_flashlight: bool = False
    patch_scope: str = "attention"  # patch_openfold's scope: "attention" or "block"
    cuda_graphs: bool = True  # replay the stacks and structure module as CUDA graphs (GPU, Flashlight)
    mmcif: bool = False
    plot: bool = True
    repeats: int = 1
    warmup: Optional[int] = None  # None: one short warm-up pass where it pays (_warmup_plan)
    num_blocks: Optional[int] = None
    recycles: int = 0
    chunk_size: object = "auto"  # see [Note: chunking only where memory needs it]
    max_msa_clusters: Optional[int] = None
    max_extra_msa: Optional[int] = None
    pad_msa: bool = False  # pad MSAs to the configured sizes instead of their depth
    sync_modules: bool = False  # [Note: synchronised module spans] in timing.py
    profile_kernels: bool = False  # one extra pass under torch.profiler (timing.kernel_profile)
    relax: bool = False  # also write <name>_relaxed.pdb (structures/relax.py)
    seed: int = 0
    tf32: bool = True
    command: Optional[List[str]] = None  # the command line, recorded in latency.json
    run_id: Optional[str] = None  # names the run in latency.json (and summary.json)


def _environment(device: torch.device, tf32: bool) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - Triton is optional for the stock path
        triton_version = None
    name = platform.processor() or platform.machine()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    return {
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "device_name": name,
        "cpu_threads": torch.get_num_threads(),
        "tf32": bool(tf32 and device.type == "cuda"),
    }


def _attention_choices() -> list:
    """The patched attention calls timed against stock so far (their keys, seconds per
    call and the variant kept), or [] where OpenFold's patch was never imported."""
    import sys

    choice = sys.modules.get("flashlight.integrations.openfold_choice")
    return [dict(t) for t in choice.TIMINGS] if choice is not None else []


def _flashlight_unusable(device: torch.device) -> Optional[str]:
    """Why Flashlight kernels cannot run on ``device``, or None when they can."""
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        if settings.get("interpret"):
            return None
        return (
            "CPU device and TRITON_INTERPRET is not set: Flashlight's Triton kernels need a "
            "GPU, or TRITON_INTERPRET=1 in the environment to run (slowly) on the CPU"
        )
    return f"Flashlight's Triton kernels do not run on {device.type} devices"


def _prediction(out: dict) -> Dict[str, Optional[np.ndarray]]:
    """Atoms (``positions`` [N, 37, 3], ``atom_mask`` [N, 37]) and confidence (pLDDT
    [N]; pTM, PAE [N, N] and max PAE with the TM head) of an OpenFold output dict."""
    return {
        "positions": out["final_atom_positions"].detach().float().cpu().numpy(),
        "atom_mask": out["final_atom_mask"].detach().float().cpu().numpy(),
        **confidence.confidence_arrays(out),
    }


def compare_predictions(stock: dict, flash: dict, flashlight_active: bool) -> dict:
    """Deviation of the Flashlight prediction from the stock one (same frame, no fitting).

    Atom deviations are Euclidean distances in angstroms over atoms present in both.
    """
    mask = (stock["atom_mask"] > 0.5) & (flash["atom_mask"] > 0.5)
    dist = np.linalg.norm(stock["positions"] - flash["positions"], axis=-1)[mask]
    dplddt = np.abs(stock["plddt"] - flash["plddt"])
    return {
        "flashlight_active": flashlight_active,
        "atoms": int(mask.sum()),
        "max_atom_deviation_A": float(dist.max()) if dist.size else 0.0,
        "rms_atom_deviation_A": float(np.sqrt(np.mean(dist**2))) if dist.size else 0.0,
        "max_plddt_difference": float(dplddt.max()),
        "mean_plddt_difference": float(dplddt.mean()),
        "note": None
        if flashlight_active
        else "Flashlight was not active; both runs used stock OpenFold",
    }


def skips_templates(model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> bool:
    """Whether ``model`` embeds templates and ``batch`` holds none that is real (every
    ``template_mask`` zero): [Note: no templates, no template work]."""
    config = getattr(getattr(model, "config", None), "template", None)
    mask = batch.get("template_mask")
    return config is not None and bool(config.get("enabled", False)) and (mask is None or not bool(mask.any()))


@contextlib.contextmanager
def _without_empty_templates(model: torch.nn.Module, batch: Dict[str, torch.Tensor], keep: bool):
    """Within the block, ``model`` skips its template embedding when ``batch`` holds no
    real template, unless ``keep`` (``--pad-msa``: the preset's fixed sizes throughout).

    [Note: no templates, no template work]
    In predict mode OpenFold's feature pipeline pads the templates to ``max_templates``
    (4 for model_1) with empty ones, and the model runs the template pair stack and the
    template pointwise attention on them, then multiplies the result by ``sum(template_mask)
    > 0``: zero when no template is real. The template angle rows it appends to the MSA
    carry the torsion-angle mask of an empty template, zero, as their MSA mask, so the row
    attention keeps them to themselves and the column attention, the outer product mean
    and the extra stack mask them out. So with no real template (every record of
    ``flashlight-fold``, which reads sequences and alignments only) the embedding adds
    nothing to the pair representation or to the real MSA rows, and skipping it gives the
    same structure and confidences (tested against the padded fold in
    ``tests/test_fold_msa_depth.py``) without its cost: about a sixth of model_1's time
    at 256 residues. The MSA's cluster rows reserved for templates are left as the data
    config has them, so the sampled rows do not change.
    """
    if keep or not skips_templates(model, batch):
        yield
        return
    config = model.config.template
    config.enabled = False
    try:
        yield
    finally:
        config.enabled = True


class Folder(RecordFiles):
    """Folds records with one model configuration; see the module docstring."""

    def __init__(self, options: FoldOptions, warn: Callable[[str], None]):
        self.options = options
        self.warn = warn
        self.device = torch.device(options.device)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(f"--device {options.device}: CUDA is not available here")
            # a bare "cuda" names no index: keep the current device then
            torch.cuda.set_device(self.device if self.device.index is not None else torch.cuda.current_device())
            torch.backends.cuda.matmul.allow_tf32 = options.tf32
            torch.backends.cudnn.allow_tf32 = options.tf32
        config = make_config(
            options.preset,
            options.num_blocks,
            options.recycles,
            options.dtype,
            options.chunk_size,
            options.max_msa_clusters,
            options.max_extra_msa,
        )
        self.data_config = config.data
        # [Note: chunking only where memory needs it] in models.py
        self.fallback_chunk_size = preset_chunk_size(options.preset) if options.chunk_size == "auto" else None
        self.info = ModelInfo(
            preset=options.preset,
            num_blocks=int(config.model.evoformer_stack.no_blocks),
            recycles=options.recycles,
            dtype=options.dtype,
            device=str(self.device),
            weights=options.params or "random",
            seed=options.seed,
            chunk_size=config.globals.chunk_size,
            max_msa_clusters=int(config.data.predict.max_msa_clusters),
            max_extra_msa=int(config.data.predict.max_extra_msa),
        )
        if options.flashlight and self.device.type == "cuda" and settings.get("warmup_compile") == "background":
            # the warm-up's compile workers (separate processes) start while the model is
            # built and the features are made ([Note: compiling in other processes] in
            # flashlight.compile_workers); they idle if Flashlight turns out unusable
            compile_workers.start_soon()
            # and (unless FLASHLIGHT_CAPTURE_PROCESS=0) the processes that trace the cores the
            # first pass meets ([Note: capturing in another process] in flashlight.capture_worker)
            capture_worker.start_soon()
        unusable = _flashlight_unusable(self.device)
        if options.flashlight and unusable is None:
            # the process's one-time compile costs, on a thread while the model is built
            # ([Note: a process's one-time costs] in flashlight.prepare): a record with
            # no MSA has its features at once, and its first pass would wait for the thread
            prepare.start()
        self.stock = build_model(config, self.info, options.params)
        self.status = PatchStatus(requested=options.flashlight)
        self.variants: Dict[str, torch.nn.Module] = {}
        if not options.flashlight:
            self.variants["stock"] = self.stock
        else:
            patched = copy.deepcopy(self.stock) if options.compare else self.stock
            if unusable:
                self.status = PatchStatus(requested=True, active=False, reason=unusable)
            else:
                self.status = apply_flashlight(
                    patched, scope=options.patch_scope,
                    cuda_graphs=options.cuda_graphs and self.device.type == "cuda")
            if self.status.active:
                if options.compare:
                    self.variants["stock"] = self.stock
                self.variants["flashlight"] = patched
            else:
                when = "" if unusable else "patching the model"
                self._flashlight_failed(patched, self.status.reason, when=when)
        self.environment = _environment(self.device, options.tf32)

    # -- Flashlight failures -------------------------------------------------------

    def _flashlight_failed(self, patched: torch.nn.Module, reason: str, when: str) -> None:
        """Fall back to stock after a Flashlight failure, loudly (or raise if required)."""
        self.status.active = False
        self.status.reason = f"{when}: {reason}" if when else reason
        if self.options.require_flashlight:
            raise FlashlightUnavailable(f"Flashlight is unavailable ({self.status.reason})")
        undo = remove_flashlight(patched)
        if patched is self.stock and undo is not None:
            raise FlashlightUnavailable(
                f"Flashlight failed ({self.status.reason}) and the model could not be "
                f"restored to stock ({undo})"
            )
        self.variants = {"stock": self.stock}
        if self.options.compare:
            self.variants["flashlight"] = self.stock
            self.warn(
                f"WARNING: Flashlight is not active ({self.status.reason}); --compare "
                "compares stock OpenFold with itself"
            )
        else:
            self.warn(
                f"WARNING: Flashlight is not active ({self.status.reason}); folding with "
                "stock OpenFold instead"
            )

    # -- running -------------------------------------------------------------------

    def _compat(self):
        if self.device.type != "cpu":
            return contextlib.nullcontext()
        try:
            from flashlight.integrations.openfold_compat import cpu_compat
        except ImportError as err:
            raise RuntimeError(
                "folding on CPU needs flashlight.integrations.openfold_compat "
                f"(OpenFold's CUDA-only softmax extension has no CPU path): {err}"
            ) from err
        return cpu_compat()

    def _warmup_plan(self, batch: Optional[Dict[str, torch.Tensor]] = None) -> tuple:
        """(warm-up passes, recycling iterations in each) for every variant.

        An explicit ``warmup`` runs that many full passes. By default a fold runs once,
        and where Flashlight compiles, it compiles during that pass ([Note: compiling in
        the background during a fold's pass] in :mod:`~flashlight.structures.compile_pass`).
        A warm-up pass is added only where passes are timed against each other
        (``compare``, or ``repeats`` above one with Flashlight compiling), so that every
        timed pass is the steady state; it runs one recycling iteration, not all of them:
        recycling repeats the same modules on the same shapes (OpenFold's ``iteration``),
        so one iteration compiles every kernel the timed passes launch, at a fraction of
        the cost. Given the record's ``batch``, such
        a warm-up is skipped where the caches already hold the fold's compiled work
        ([Note: skipping the warm-up when the caches are warm] in
        :mod:`~flashlight.structures.warm_folds`), except for ``compare``.
        """
        opts = self.options
        if opts.warmup is not None:
            return opts.warmup, opts.recycles + 1
        wanted = opts.compare or (self._compiles() and opts.repeats > 1)
        if wanted and not opts.compare and batch is not None and warm_folds.compiled_before(self._fold_key(batch)):
            wanted = False
        return (1 if wanted else 0), 1

    def _compiles(self) -> bool:
        """Whether this fold runs Flashlight (whose first calls compile)."""
        return self.status.active and "flashlight" in self.variants

    def _compiles_in_pass(self, batch: Dict[str, torch.Tensor]) -> bool:
        """Whether the first timed pass compiles Flashlight's kernels in the background:
        a fold without a warm-up whose compiled work the caches do not hold yet."""
        return (self._warmup_plan(batch)[0] == 0 and self._compiles()
                and not warm_folds.compiled_before(self._fold_key(batch)))

    def _fold_key(self, batch: Dict[str, torch.Tensor]) -> str:
        opts = self.options
        return warm_folds.fold_key(self.info.to_json(), batch, {
            "dtype": opts.dtype, "tf32": opts.tf32, "chunk_size": str(opts.chunk_size),
            "scope": opts.patch_scope, "pad_msa": opts.pad_msa, "recycles": opts.recycles})

    def _module_pass(self) -> bool:
        """Whether a comparison adds one pass with synchronised module starts after the
        timed ones: on a GPU, where the timed passes' module spans depend on the queue the
        module before left ([Note: synchronised module spans]); the model's time still
        comes from the unsynchronised passes."""
        opts = self.options
        return opts.compare and not opts.sync_modules and self.device.type == "cuda"

    def runs_per_record(self, batch: Optional[Dict[str, torch.Tensor]] = None) -> int:
        """Recycling iterations per record (all variants), for progress reporting; given
        the record's ``batch``, exactly (its warm-up may be skipped, :meth:`_warmup_plan`)."""
        warmups, iterations = self._warmup_plan(batch)
        passes = self.options.repeats + (1 if self._module_pass() else 0)
        per_variant = warmups * iterations + passes * (self.options.recycles + 1)
        return per_variant * len(self.variants)

    def _run_variant(self, model, batch, on_recycle) -> tuple:
        """Warm-up and timed passes of ``model``; without chunking first when the chunk
        size is ``auto``, and again chunked if that runs out of GPU memory."""
        try:
            return self._passes(model, batch, on_recycle)
        except torch.OutOfMemoryError:
            if self.fallback_chunk_size is None or model.globals.chunk_size is not None:
                raise
        import gc

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        tuned = bool(chunk_size_tuners(model))
        self.warn(
            f"note: the GPU ran out of memory without chunking; folding again with "
            f"chunk_size {self.fallback_chunk_size} (OpenFold's {self.options.preset} setting"
            + ("; its chunk-size tuner raises it where memory allows)" if tuned else ")")
        )
        set_chunk_size(model, self.fallback_chunk_size)
        return self._passes(model, batch, on_recycle)

    @contextlib.contextmanager
    def _inference(self, model, batch):
        """What every pass of ``model`` runs inside: no autograd, the CPU stand-ins where
        needed, and no empty-template work ([Note: no templates, no template work])."""
        with torch.no_grad(), self._compat(), _without_empty_templates(model, batch, self.options.pad_msa):
            yield

    def _passes(self, model, batch, on_recycle) -> tuple:
        opts = self.options
        warmups, iterations = self._warmup_plan(batch)
        if warmups:
            log.info(f"  warm-up: {warmups} pass(es) of {iterations} recycling iteration(s)")
        # [..., R] features -> the first ``iterations`` recycling iterations
        warm_batch = {k: v[..., :iterations] for k, v in batch.items()}
        warm, steady = [], []
        warmup_compile: dict = {}  # how the warm-up compiled (_compiling_in_background)
        prepared = prepare.state()  # the preparing thread when the first pass starts
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_NOISY_OPENFOLD_WARNING)
            with self._inference(model, batch), FrozenHeap() as heap, \
                    LayerTimer(model, self.device, on_recycle, opts.sync_modules) as timer:
                for _ in range(warmups):
                    heap.refreeze()  # [Note: the collector between passes] in timing.py
                    compiling = compile_pass.compiling_in_background(not warm, self.device, warmup_compile)
                    out, timing = timer.run(lambda: compile_pass.run_within(compiling, model, warm_batch))
                    warm.append(timing)
                in_pass = self._compiles_in_pass(batch)
                if in_pass:
                    log.info("  compiling Flashlight's kernels during the pass (no warm-up)")
                for _ in range(opts.repeats):
                    heap.refreeze()
                    first = in_pass and not steady  # the pass that compiles
                    compiling = compile_pass.compiling_in_background(first, self.device, warmup_compile)
                    out, timing = timer.run(lambda: compile_pass.run_within(compiling, model, batch))
                    steady.append(timing)
                    compiled = ", Flashlight's kernels compiled in it" if first else ""
                    log.info(f"  model: {timing.model_s:.1f} s ({opts.recycles + 1} recycling "
                             f"iteration(s){compiled})")
                # one more pass, not timed: what it ran, by kernel
                kernels = kernel_profile(lambda: model(batch), self.device) if opts.profile_kernels else None
            synchronised = None
            if self._module_pass():
                # modules compared on their own latency ([Note: synchronised module spans]),
                # every iteration eager ([Note: layer spans under CUDA graphs])
                with self._inference(model, batch), openfold_graphs.eager(model), FrozenHeap(), \
                        LayerTimer(model, self.device, on_recycle, True) as sync_timer:
                    synchronised = sync_timer.run(lambda: model(batch))[1]
        median = median_timing(steady)
        run = {
            "warmup_s": [t.model_s for t in warm],
            "warmup_compile": warmup_compile,  # of the warm-up, or of the first pass where it compiled
            "compiled_in_pass": bool(in_pass),
            "prepare_at_first_pass": prepared,
            "runs_s": [t.model_s for t in steady],
            "steady": median.to_json(),
            "warmup": [t.to_json() for t in warm],
        }
        if synchronised is not None:
            run["modules_synchronised"] = synchronised.to_json()
        run["chunk_size"] = model.globals.chunk_size
        if model.globals.chunk_size is not None:
            run["tuned_chunk_sizes"] = tuned_chunk_sizes(model)
        graphed = openfold_graphs.installed(model)
        if graphed:  # [Note: CUDA graphs for the stacks]
            run["cuda_graphs"] = [g.summary() | {"module": type(g.module).__name__} for g in graphed]
        if kernels is not None:
            run["kernels"] = kernels
        return run, _prediction(out), timer.method

    def fold(self, record: Record, on_recycle: Optional[Callable[[], None]] = None,
             on_total: Optional[Callable[[int], None]] = None) -> dict:
        """Fold ``record``, write its outputs, and return its ``latency.json`` report.
        ``on_recycle`` is called after each recycling iteration; ``on_total`` once the
        features are made, with how many iterations the record runs (:meth:`runs_per_record`)."""
        opts = self.options
        wall_start = time.perf_counter()

        start = time.perf_counter()
        depth = feature_builder.msa_depth(record)
        # [Note: folding at the MSA's depth] in features.py
        data_config = self.data_config if opts.pad_msa else feature_builder.fit_msa_rows(self.data_config, depth)
        feats = feature_builder.processed_features(record, data_config, opts.seed)
        batch = feature_builder.to_device(feats, self.device, DTYPES[opts.dtype])
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        features_s = time.perf_counter() - start
        if on_total is not None:
            on_total(self.runs_per_record(batch))
        log.info(f"record {record.id!r}: features in {features_s:.1f} s (MSA depth {depth})")

        runs: Dict[str, dict] = {}
        predictions: Dict[str, dict] = {}
        timer_method = None
        if len(self.variants) > 1:
            # no variant is timed while the workers start or the preparing thread runs
            # ([Note: a process's one-time costs] in flashlight.prepare)
            compile_workers.wait_ready()
            capture_worker.wait_ready()
            prepare.wait()
            prepare.wait_preloads()
        for name in list(self.variants):
            model = self.variants[name]
            try:
                runs[name], predictions[name], timer_method = self._run_variant(model, batch, on_recycle)
            except Exception as err:  # noqa: BLE001 - Flashlight failures fall back
                if name != "flashlight" or not self.status.active:
                    raise
                self._flashlight_failed(model, f"{type(err).__name__}: {err}", "first Flashlight run")
                if "stock" not in runs:
                    runs["stock"], predictions["stock"], timer_method = self._run_variant(
                        self.stock, batch, on_recycle
                    )
                if name in self.variants:
                    # stock's run, marked: no report may read it as Flashlight's timing
                    runs[name] = {**copy.deepcopy(runs["stock"]), "fell_back": self.status.reason}
                    predictions[name] = predictions["stock"]

        primary = "flashlight" if ("flashlight" in runs and self.status.active) else "stock"
        comparison = None
        if "stock" in predictions and "flashlight" in predictions:
            comparison = compare_predictions(
                predictions["stock"], predictions["flashlight"], self.status.active
            )
        pred = predictions[primary]
        if primary == "flashlight":  # its compiled work is in the caches now
            warm_folds.remember(self._fold_key(batch))

        model_s = runs[primary]["steady"]["model_s"]
        report = {
            "schema": SCHEMA,
            "command": opts.command,
            "run_id": opts.run_id,
            "options": {
                k: v for k, v in dataclasses.asdict(opts).items() if k not in ("command", "run_id")
            },
            "record": {
                "id": record.id,
                "description": record.description,
                "length": record.length,
                "sequence": record.sequence,
                "input_sequence": record.input_sequence,
                "substitutions": [
                    {"position": i, "read": a, "folded": b} for i, a, b in record.substitutions
                ],
                "unknown_positions": record.unknown_positions,
                "source": record.source,
                "index_in_file": record.index,
                "msa": record.alignment.paths if record.alignment else None,
                "msa_depth": record.alignment.depth if record.alignment else 1,
                "msa_rows": {
                    "clusters": int(data_config.predict.max_msa_clusters),
                    "extra": int(data_config.predict.max_extra_msa),
                    "padded_to_configured_sizes": opts.pad_msa,
                },
                "empty_templates_skipped": not opts.pad_msa and skips_templates(self.stock, batch),
            },
            "model": {**self.info.to_json(), "label": self.info.label()},
            "flashlight": self.status.to_json(),
            # small attention calls timed against stock in this process, and what each kept
            # ([Note: the faster of stock and patched attention])
            "attention_choices": _attention_choices(),
            "timer": timer_method,
            "environment": self.environment,
            "warmup_runs": len(runs[primary]["warmup_s"]),
            "warmup_recycling_iterations": self._warmup_plan()[1],
            "repeats": opts.repeats,
            "runs": runs,
            "end_to_end": {
                "variant": primary,
                "features_s": features_s,
                "model_s": model_s,
                "write_s": None,  # the rest is filled in by RecordFiles._write_record
                "total_s": None,
                "wall_s": None,
            },
            "comparison": comparison,
            "mean_plddt": float(pred["plddt"].mean()),
            "ptm": None if pred["ptm"] is None else float(pred["ptm"]),
            "mean_pae": None if pred["pae"] is None else float(pred["pae"].mean()),
            "plddt": [round(float(x), 3) for x in pred["plddt"]],
            "relax": None,
            "outputs": None,
        }
        return self._write_record(record, pred, report, wall_start)
