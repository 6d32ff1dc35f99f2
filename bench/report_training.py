"""The training section of ``bench/results/REPORT.md``: forward + backward of the Evoformer
attentions (``training.json``, from ``bench.training``) and a ``model_1`` training step
(``training_step.json``, from ``bench.training_step``)."""
from __future__ import annotations

import json
import pathlib

IMPL_TITLES = {"eager": "eager", "torch_compile": "torch.compile", "flex": "FlexAttention",
               "flashlight": "Flashlight", "cuequivariance": "cuEquivariance", "trifast": "trifast"}


def _machine(env: dict) -> str:
    return (f"{env.get('gpu')} (driver {env.get('driver')}), torch {env.get('torch')}, "
            f"Triton {env.get('triton')}, {str(env.get('date', ''))[:10]}")


def _cell(c: dict | None) -> str:
    if not c or c.get("status") == "n/a":
        return "–"
    if c.get("status") != "ok":
        return c.get("status", "–")
    return f"{c['ms']:.3f} ({c['peak_mib']:.0f} MiB)"


def kernel_lines(data: dict) -> list[str]:
    cells = data["cells"]
    impls = [i for i in IMPL_TITLES if any(c["impl"] == i and c.get("status") == "ok" for c in cells)]
    rows: dict[tuple, dict] = {}
    for c in cells:
        rows.setdefault((c["variant"], json.dumps(c["shape"]), c["dtype"]), {})[c["impl"]] = c
    lines = ["| case | dtype | " + " | ".join(IMPL_TITLES[i] for i in impls)
             + " | Flashlight GPU time | fastest other / Flashlight |",
             "|" + "---|" * (len(impls) + 4)]
    for (variant, shape, dtype), row in rows.items():
        ok = {i: c["ms"] for i, c in row.items() if c.get("status") == "ok"}
        others = [t for i, t in ok.items() if i != "flashlight"]
        fl = row.get("flashlight", {})
        gpu = f"{sum(fl['kernels_us'].values()) / 1e3:.3f}" if fl.get("kernels_us") else "–"
        ratio = f"{min(others) / ok['flashlight']:.2f}×" if others and "flashlight" in ok else "–"
        label = " ".join(f"{k}{v}" for k, v in json.loads(shape).items())
        lines.append(f"| `{variant}` {label} | {dtype} | " + " | ".join(_cell(row.get(i)) for i in impls)
                     + f" | {gpu} | {ratio} |")
    return lines


def step_lines(data: dict) -> list[str]:
    r, cfg = data["results"], data["config"]
    stock, fl = r.get("stock", {}), r.get("flashlight", {})
    if "step_s" not in stock or "step_s" not in fl:
        return [f"- `model_1` training step: not measured ({stock.get('error') or fl.get('error')})"]
    return [f"`model_1` training step ({cfg['residues']} residues, {cfg['clusters']} MSA and {cfg['extra']} "
            f"extra-MSA rows, {cfg['precision']}; {_machine(data['environment'])}):", "",
            "| | step s (median) | peak GiB | first step s | loss |", "|---|---|---|---|---|",
            f"| stock | {stock['step_s']:.3f} | {stock['peak_gib']:.2f} | {stock['first_step_s']} | {stock['loss']:.6g} |",
            f"| Flashlight | {fl['step_s']:.3f} | {fl['peak_gib']:.2f} | {fl['first_step_s']} | {fl['loss']:.6g} |",
            "", f"Flashlight {stock['step_s'] / fl['step_s']:.2f}× the speed of stock at "
            f"{fl['peak_gib'] / stock['peak_gib']:.2f}× its peak memory."]


def profile_lines(data: dict) -> list[str]:
    families = ("flashlight", "softmax_extension", "gemm", "copy_elementwise", "other")
    lines = ["Where one training step's GPU time goes (`bench/training_profile.py`, seconds; \"GPU busy\": the "
             "profiled device time, the rest of the wall time the GPU waits for the host):", "",
             "| | wall | GPU busy | " + " | ".join(f.replace("_", " ") for f in families) + " |",
             "|" + "---|" * (len(families) + 3)]
    for name, row in data["results"].items():
        by = row["by_family_s"]
        lines.append(f"| {name} | {row['wall_s']:.2f} | {row['gpu_busy_s']:.2f} | "
                     + " | ".join(f"{by.get(f, 0.0):.2f}" for f in families) + " |")
    return lines


def saved_lines(data: dict) -> list[str]:
    """What one checkpointed block keeps for its backward (``training_saved.json``)."""
    lines = ["What one block of `model_1` keeps for its backward pass in training (`bench/training_saved.py`: "
             "the distinct storages autograd saves, not parameters or inputs, counted at prime lengths "
             "and sized at the training lengths; counts, not a measured peak; "
             f"{data['environment'].get('device', '?')}, torch {data['environment'].get('torch', '?')}). "
             "Checkpointed per block, a step's backward holds this for one block at a time, on top of "
             "every block's checkpointed inputs:", "",
             "| block | sequences x residues | stock MiB | attention cores | whole block |", "|---|---|---|---|---|"]
    for name, row in data["results"].items():
        stock = row["stock"]["mib"]
        lines.append(f"| {name} | {row['sequences']} x {row['residues']} | {stock:.0f} | "
                     + " | ".join(f"{row[m]['mib']:.0f} ({row[m]['mib'] / stock:.2f}x)" for m in ("attention", "block"))
                     + " |")
    return lines


def training_lines(results: pathlib.Path) -> list[str]:
    """The section's lines, or none when neither result file exists."""
    kernels, step = results / "training.json", results / "training_step.json"
    if not kernels.exists() and not step.exists():
        return []
    lines = ["## Training: forward + backward", ""]
    if kernels.exists():
        data = json.loads(kernels.read_text())
        lines += [f"Forward + backward through `torch.autograd.grad`, gradients of q, k, v, the bias and the "
                  f"gate, median ms (peak MiB above what was allocated before the call); \"Flashlight GPU "
                  f"time\": the sum of its kernels' device time in one call (the rest of its wall time is "
                  f"host work: launches and autograd); {_machine(data['environment'])}.", ""]
        lines += kernel_lines(data) + [""]
    if step.exists():
        lines += step_lines(json.loads(step.read_text())) + [""]
    profile = results / "training_step_profile.json"
    if profile.exists():
        lines += profile_lines(json.loads(profile.read_text())) + [""]
    saved = results / "training_saved.json"
    if saved.exists():
        lines += saved_lines(json.loads(saved.read_text())) + [""]
    return lines
