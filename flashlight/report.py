"""What Flashlight reports about a compile: the kernels it generated and the operations
left outside them (:func:`flashlight.explain` returns an :class:`ExplainReport`)."""
from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class KernelReport:
    """One generated Flashlight kernel."""

    name: str
    source: str  # the Triton source, as compiled
    aten_ops: tuple[str, ...]  # the ATen operations it absorbed
    # (BLOCK_M, BLOCK_N, num_warps, num_stages) autotuning draws from on a GPU: by default it
    # times the 3-4 of them a cost model picks, with FLASHLIGHT_AUTOTUNE=full all of them
    gpu_configs: tuple[tuple[int, int, int, int], ...] = ()
    _aot: Callable | None = dataclasses.field(default=None, repr=False, compare=False)
    _chosen: Callable | None = dataclasses.field(default=None, repr=False, compare=False)

    def chosen_configs(self) -> dict[tuple[int, ...], tuple[int, int, int, int] | str]:
        """The launches so far: size arguments -> (BLOCK_M, BLOCK_N, num_warps, num_stages).

        On a GPU, the configuration autotuning picked for those sizes, or the string
        ``"eager"`` where the unfused graph the kernel replaced was faster and runs
        instead; under the Triton interpreter, the single configuration it runs.
        """
        return self._chosen() if self._chosen is not None else {}

    def aot_compile(self, capability: int = 90, **config: int):
        """Compile this kernel ahead of time for an NVIDIA GPU of ``capability`` (no GPU needed).

        ``config``: ``block_m``, ``block_n``, ``num_warps``, ``num_stages``; the build is
        specialized on the kernel's first launch as Triton's JIT specializes it (strides of 1
        constant, multiples of 16 marked; ``specialize=None``: nothing assumed, as before
        any launch). Returns a
        ``flashlight.aot.AotResult``: shared memory, and registers and spill stack
        per thread where Triton's ``cuobjdump`` is installed.
        """
        if self._aot is None:
            raise RuntimeError("this report has no compiler attached")
        return self._aot(capability, **config)


@dataclasses.dataclass(frozen=True)
class FallbackOp:
    """An ATen operation that runs outside Flashlight kernels, and why."""

    name: str
    reason: str
    runs: str = "eager"  # what runs it: "inductor" (compiled around the kernels) or "eager"


@dataclasses.dataclass
class ExplainReport:
    """What :func:`explain` found: kernels generated and operations left to the fallback."""

    kernels: list[KernelReport] = dataclasses.field(default_factory=list)
    fallback_ops: list[FallbackOp] = dataclasses.field(default_factory=list)
    graphs: int = 0  # FX graphs torch.compile handed to Flashlight
    graph_breaks: list[str] = dataclasses.field(default_factory=list)  # Dynamo's reasons, as it logged them
    # errors inside Flashlight's compile steps (or Inductor's) after which a graph ran without them
    errors: list[str] = dataclasses.field(default_factory=list)
    # graph rewrites made before lowering (concatenations split onto their pieces)
    rewrites: list[str] = dataclasses.field(default_factory=list)

    @property
    def inductor_ops(self) -> list[str]:
        """The fallback operations Inductor compiled (the rest of ``fallback_ops`` ran eagerly)."""
        return [op.name for op in self.fallback_ops if op.runs == "inductor"]

    def __str__(self) -> str:
        lines = [f"{len(self.kernels)} Flashlight kernel(s), {len(self.fallback_ops)} fallback op(s)"
                 + (f" ({len(self.inductor_ops)} compiled by Inductor)" if self.inductor_ops else "")]
        if self.graphs == 0:
            lines.append("  torch.compile handed Flashlight no graph: Dynamo ran the function eagerly")
        for why in self.graph_breaks:
            lines.append(f"  graph break: {why}")
        for why in self.errors:
            lines.append(f"  error: {why}")
        for what in self.rewrites:
            lines.append(f"  rewrite: {what}")
        for kernel in self.kernels:
            lines.append(f"  kernel {kernel.name}: {', '.join(kernel.aten_ops)}")
        for op in self.fallback_ops:
            where = " (compiled by Inductor)" if op.runs == "inductor" else ""
            lines.append(f"  fallback {op.name}{where}: {op.reason}")
        return "\n".join(lines)
