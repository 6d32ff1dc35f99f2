"""User-facing entry points: the ``torch.compile`` backend, ``compile`` and ``explain``."""
from __future__ import annotations

from typing import Any, Callable

import torch

from flashlight.report import ExplainReport, FallbackOp, KernelReport

__all__ = ["ExplainReport", "FallbackOp", "KernelReport", "compile", "explain"]


def compile(fn: Callable, *, dynamic: bool | None = None, capture: str = "dynamo",
            version: str = "", **options: Any) -> Callable:
    """``torch.compile(fn, backend="flashlight")`` with Flashlight options.

    Operations outside Flashlight kernels are compiled by Inductor around them, or run
    eagerly. Options: ``autotune`` (bool) overrides ``FLASHLIGHT_AUTOTUNE`` for these
    kernels; ``remainder`` (``"inductor"`` or ``"eager"``) overrides
    ``FLASHLIGHT_REMAINDER``; unknown options raise ``TypeError``.

    ``capture="trace"`` compiles a pure function of tensors without Dynamo and keeps the
    compiled graph on disk for later processes (:class:`flashlight.traced.TracedFunction`,
    [Note: traced capture]); ``version`` then names the state of code outside ``fn``'s
    source file that ``fn`` calls. ``dynamic`` means what it means to ``torch.compile``
    with either capture (None: static first, then the sizes that changed symbolic).
    """
    from flashlight.backend import check_options, make_backend

    check_options({k: v for k, v in options.items() if k != "report"})  # make_backend's own argument
    if capture == "trace":
        from flashlight.traced import TracedFunction

        return TracedFunction(fn, options, version=version, dynamic=dynamic)
    if capture != "dynamo":
        raise ValueError(f"capture={capture!r}: expected 'dynamo' or 'trace'")
    return torch.compile(fn, backend=make_backend(**options), dynamic=dynamic)


def explain(fn: Callable, *args: Any, **kwargs: Any) -> ExplainReport:
    """Compile ``fn`` for these inputs, run it once, and report what Flashlight generated
    (and, where Dynamo split or skipped ``fn``, its graph-break reasons)."""
    from torch._dynamo.utils import counters

    from flashlight.backend import make_backend

    report = ExplainReport()
    torch.compiler.reset()
    counters["graph_break"].clear()
    compiled = torch.compile(fn, backend=make_backend(report=report))
    with torch.no_grad():
        compiled(*args, **kwargs)
    report.graph_breaks = [" ".join(str(why).split())[:300] for why in counters["graph_break"]]
    torch.compiler.reset()
    return report
