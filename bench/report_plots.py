"""The report's plots (``bench/results/plots/*.png``), from the cells ``bench.report`` loads.

Matplotlib is imported when a plot is drawn, with the Agg backend: no display is needed.
"""
from __future__ import annotations

import pathlib

from bench.report import DTYPE_TITLES, IMPL_TITLES, IMPLS, MODE_TITLES, case_shape, ok_ms


def plot_kernels(case_map: dict, out_dir: pathlib.Path) -> list[pathlib.Path]:
    """One bar chart per dtype: each peer's time relative to Flashlight's, per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for dtype in ("bf16", "tf32", "fp32"):
        keys = [k for k in case_map if k[2] == dtype and ok_ms(case_map[k].get("flashlight"))]
        if not keys:
            continue
        impls = [i for i in IMPLS if i != "flashlight" and any(ok_ms(case_map[k].get(i)) for k in keys)]
        fig, ax = plt.subplots(figsize=(10, 0.32 * len(keys) * max(1, len(impls)) / 2 + 2))
        height = 0.8 / max(1, len(impls))
        for j, impl in enumerate(impls):
            ys, xs = [], []
            for i, k in enumerate(keys):
                ms = ok_ms(case_map[k].get(impl))
                if ms:
                    ys.append(i + j * height)
                    xs.append(ms / case_map[k]["flashlight"]["ms"])
            ax.barh(ys, xs, height=height, label=IMPL_TITLES[impl])
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xscale("log")
        ax.set_yticks([i + 0.4 - height / 2 for i in range(len(keys))])
        ax.set_yticklabels([f"{k[0]} [{case_shape(case_map[k])}]" for k in keys], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("time relative to Flashlight (> 1: Flashlight faster)")
        ax.set_title(f"Forward time vs Flashlight, {DTYPE_TITLES[dtype]}")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = out_dir / f"kernels_{dtype}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_evoformer(cells: list[dict], out_dir: pathlib.Path) -> list[pathlib.Path]:
    """The end-to-end times (Evoformer stack, model_1) per mode and N_res."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [c for c in cells if c["status"] == "ok"]
    if not ok:
        return []
    groups = sorted({(c["scope"], c["n_res"]) for c in ok}, key=lambda g: (g[0] != "stack", g[1]))
    modes = [m for m in ("stock", "compile", "flashlight", "flashlight-block") if any(c["mode"] == m for c in ok)]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        xs, ys = [], []
        for i, g in enumerate(groups):
            c = next((c for c in ok if (c["scope"], c["n_res"]) == g and c["mode"] == mode), None)
            if c:
                xs.append(i + j * width)
                ys.append(c["ms"])
        ax.bar(xs, ys, width=width, label=MODE_TITLES[mode])
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{'stack' if s == 'stack' else 'model_1'}\nN_res {n}" for s, n in groups])
    ax.set_ylabel("ms (median)")
    ax.set_title("OpenFold end to end (fp32 with TF32)")
    ax.legend()
    fig.tight_layout()
    path = out_dir / "evoformer.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
