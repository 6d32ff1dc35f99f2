"""The ``torch.compile`` backend: capture, compile, and stitch kernels into the FX graph.

Capture goes through public doors only: Dynamo hands us an FX graph, AOTAutograd's
``aot_autograd`` turns it into an ATen-level inference graph (functionalized, with
symbolic sizes when Dynamo marks lengths dynamic), and we return a callable
``GraphModule``. Nodes computed by a Flashlight kernel are replaced by a call to its
:class:`~flashlight.runtime.Launcher`; everything else stays in the graph, which
Inductor then compiles around the kernels (:mod:`flashlight.inductor`; each kernel an
opaque op to it) or which runs eagerly (``remainder="eager"``).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import warnings
from typing import Any

import torch
import torch.fx as fx

from flashlight import settings
from flashlight.codegen import fp32_precision, generate
from flashlight.concatenations import split_concatenations
from flashlight.shifts import drop_repeated_maxes
from flashlight.decompositions import decompositions, recompose_softmax
from flashlight.graph_edits import sizes_read_from_inputs
from flashlight.layer_norms import write_out_layer_norms
from flashlight.indexing import Unsupported, node_shape
from flashlight.ir import Reduce, TiledKernel, walk
from flashlight.lower import REINDEXING, lower
from flashlight.pipeline import Plan, compile_graph, fix_tile_sizes
from flashlight.random_ops import draw_seeds_first
from flashlight.report import ExplainReport, FallbackOp, KernelReport
from flashlight.aot import aot_compile
from flashlight.launch_sizes import UnreadableSizes
from flashlight.runtime import COMPILE_EVENTS, Launcher
from flashlight.tile_configs import config_space

log = logging.getLogger("flashlight")
aten = torch.ops.aten

# ops that only re-index memory; never listed as fallback work
VIEW_LIKE = REINDEXING | {aten.slice.Tensor, aten.select.int, aten.as_strided.default}


def _on_cpu(example_inputs) -> bool:
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


def _graph_tensors(gm: fx.GraphModule, example_inputs) -> list[torch.Tensor]:
    """The graph's inputs and the (fake) values of its nodes."""
    found = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    for node in gm.graph.nodes:
        fx.node.map_aggregate(node.meta.get("val"), lambda v: found.append(v) if isinstance(v, torch.Tensor) else None)
    return found


def _host_scalar(t: torch.Tensor) -> bool:
    """A 0-dim CPU tensor, which PyTorch lets CUDA operations take (a size's arithmetic
    in a graph whose sizes are symbolic: ``scalar_tensor(s0) ** -0.5``); a kernel reads
    it from the device ([Note: host scalars])."""
    return t.dim() == 0 and t.device.type == "cpu"


def _unsupported_graph(gm: fx.GraphModule, example_inputs) -> str | None:
    """Why no Flashlight kernel can run this graph (it then runs as PyTorch runs it), or None."""
    tensors = _graph_tensors(gm, example_inputs)
    devices = sorted({t.device.type for t in tensors if not _host_scalar(t)} or {t.device.type for t in tensors})
    if devices == ["cpu"] and not settings.get("interpret"):
        warnings.warn("Flashlight kernels need a CUDA device, or TRITON_INTERPRET=1 on CPU; "
                      "running this graph without them", stacklevel=3)
        return "CPU tensors without the Triton interpreter"
    if devices not in ([], ["cpu"], ["cuda"]):
        return (f"tensors on {' and '.join(devices)}: Flashlight kernels run on one CUDA device, "
                "or on the CPU under TRITON_INTERPRET=1")
    for t in tensors:
        if any(isinstance(size, int) and size == 0 for size in t.shape):
            return f"a zero-size tensor (shape {list(t.shape)}): nothing for a kernel to compute"
    return None


def _op_name(node: fx.Node) -> str:
    return str(node.target).replace("aten.", "")


def build(gm: fx.GraphModule, example_inputs, report: ExplainReport | None, options: dict[str, Any],
          inductor_remainder: bool = False):
    """Compile one ATen graph: returns the callable that replaces it. With
    ``inductor_remainder`` (Inductor compiles what Flashlight leaves), the kernels that
    are single contractions go back to the graph ([Note: what Flashlight keeps when
    Inductor compiles the rest])."""
    unsupported = _unsupported_graph(gm, example_inputs)
    if unsupported is not None:
        if settings.debug_level() >= 1:
            log.warning("[flashlight] this graph runs outside Flashlight: %s", unsupported)
        _record(report, gm, Plan({}, {}, None), {}, reason=unsupported)
        return gm
    sizes_read_from_inputs(gm)  # [Note: sizes read off computed tensors]
    split = _split_concatenations(gm)
    shifted = drop_repeated_maxes(gm)  # [Note: a softmax of scores less their row max]
    written_out = write_out_layer_norms(gm)  # [Note: a layer norm written out]
    draw_seeds_first(gm)  # [Note: dropout inside a kernel]
    lowered = lower_and_log(gm)
    if fix_tile_sizes(gm, example_inputs, lowered):
        lowered = lower_and_log(gm)  # those sizes now read as numbers
    plan = compile_graph(lowered)
    if inductor_remainder:
        plan = _fused_loops_only(plan)
    nodes = {n.name: n for n in gm.graph.nodes}
    launchers: dict[str, Launcher] = {}
    for node_name, tiled in list(plan.kernels.items()):
        interpret = _on_cpu(example_inputs)
        src = generate(tiled, None, fp32_precision(), interpret, settings.get("check_bounds"))
        src = dataclasses.replace(src, input_sizes=tuple(_sizes(nodes[name]) for name in src.inputs))
        if settings.debug_level() >= 2:
            log.warning("[flashlight] Triton source for %s\n%s", node_name, src.source)
        try:
            launchers[node_name] = Launcher(
                tiled, src, autotune=options.get("autotune"),
                input_dtypes=tuple(nodes[name].meta["val"].dtype for name in src.inputs),
                aten_ops=tuple(_op_name(nodes[o]) for o in tiled.kernel.origins if o in nodes),
                eager=_eager_subgraph(gm, plan.nodes_of(node_name), src.inputs))
        except UnreadableSizes as why:  # that kernel's operations run as the graph has them
            plan = _without_kernels(plan, {node_name}, str(why))
    _stitch(gm, launchers, plan)
    _record(report, gm, plan, launchers)
    if split and report is not None:
        report.rewrites.append(f"{split} concatenation(s): reductions, softmaxes and slices over them taken "
                               "on their pieces")
    if shifted and report is not None:
        report.rewrites.append(f"{shifted} max(es) of values already less their row max: known, not taken again")
    if written_out and report is not None:
        report.rewrites.append(f"{written_out} layer norm(s) of computed values written out as their ATen ops")
    return gm


def _sizes(node: fx.Node) -> tuple:
    """``node``'s sizes as the IR writes them (a number, a symbolic size's text)."""
    try:
        return node_shape(node)
    except Unsupported:
        return ()


def _split_concatenations(gm: fx.GraphModule) -> int:
    """:func:`~flashlight.concatenations.split_concatenations` ([Note: reductions through a
    concatenation]); 0 where it fails (each rewrite it made is exact, the rest as written)."""
    try:
        return split_concatenations(gm)
    except Exception as error:  # noqa: BLE001 - the graph as written is right, only slower
        log.warning("[flashlight] the concatenations stay as written: %s", error)
        return 0


# [Note: what Flashlight keeps when Inductor compiles the rest]
# A kernel whose loop chains work that no library call does in one pass is Flashlight's
# to run: an online max (a softmax over the loop, whose probabilities never reach
# memory), or a loop reduction over values that are themselves reductions (scores as
# dots of queries and keys, recomputed tile by tile in a backward). The rest of the
# plan's kernels are single contractions with elementwise work around them (a gated
# triangle multiplication, an outer product, a normed projection) or have no loop at
# all; Inductor runs those as well or better (its matmul templates or cuBLAS, with its
# own prologue and epilogue fusion), so when it compiles the rest of the graph they stay
# in the graph for it, with the reason in ``explain()``. Measured on an H200 (TF32, the
# 48 Evoformer blocks of model_1 at 256 residues, ``bench/results/block_scope``): whole
# blocks with Flashlight's single contractions took 458 ms, without them 267 ms. With
# the eager remainder Flashlight keeps them: fused, they save PyTorch's separate calls.


def _fused_loops_only(plan: Plan) -> Plan:
    """``plan`` without the kernels Inductor runs at least as well."""
    dropped = {node for node, tiled in plan.kernels.items() if not _chains_in_loop(tiled)}
    return _without_kernels(plan, dropped, "a single contraction or no loop: left to Inductor")


def _without_kernels(plan: Plan, dropped: set[str], reason: str) -> Plan:
    """``plan`` without the kernels of nodes ``dropped``: their operations stay in the
    graph, with ``reason``."""
    kept, rejected, outputs = {}, dict(plan.rejected), {}
    for node, tiled in plan.kernels.items():
        if node not in dropped:
            kept[node] = tiled
            if node in plan.outputs:
                outputs[node] = plan.outputs[node]
        else:
            for origin in tiled.kernel.origins:
                rejected.setdefault(origin, reason)
    return dataclasses.replace(plan, kernels=kept, rejected=rejected, outputs=outputs)


def _chains_in_loop(tiled: TiledKernel) -> bool:
    """Whether ``tiled``'s loop has an online max or reduces values that are reductions."""
    return any(red.op == "max" or any(isinstance(node, Reduce) for e in red.exprs() for node in walk(e))
               for red in tiled.kernel.loop)


def lower_and_log(gm: fx.GraphModule):
    lowered = lower(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    for name, reason in lowered.opaque.items():
        nodes[name].meta["flashlight_reason"] = reason
        if settings.debug_level() >= 1:
            log.warning("[flashlight] %s runs outside Flashlight: %s", name, reason)
    return lowered


def _eager_subgraph(gm: fx.GraphModule, outputs: tuple[str, ...], inputs: tuple[str, ...]) -> fx.GraphModule | None:
    """The nodes of ``gm`` computing nodes ``outputs`` from nodes ``inputs``, as a graph
    taking those inputs and returning that value (a tuple of them for several outputs),
    each decomposed softmax one PyTorch softmax again; symbolic sizes are read from the
    inputs' shapes. None when a size cannot be read from them."""
    nodes = {n.name: n for n in gm.graph.nodes}
    sub = fx.Graph()
    env = {}
    for name in inputs:
        env[nodes[name]] = sub.placeholder(name)
        env[nodes[name]].meta.update(nodes[name].meta)  # its value's metadata, for rewrites
    needed, stack = set(), [nodes[output] for output in outputs]
    while stack:
        node = stack.pop()
        if node not in env and node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    for node in gm.graph.nodes:  # topological order
        if node not in needed:
            continue
        if node.op == "placeholder":
            env[node] = _size_from_inputs(sub, node, [nodes[name] for name in inputs], env)
            if env[node] is None:
                return None
        else:
            env[node] = sub.node_copy(node, lambda n: env[n])
    values = [env[nodes[output]] for output in outputs]
    sub.output(values[0] if len(values) == 1 else tuple(values))
    unfused = fx.GraphModule(gm, sub)
    recompose_softmax(unfused)  # PyTorch's softmax, not the parts the lowering reads
    return unfused


def _size_from_inputs(sub: fx.Graph, placeholder: fx.Node, inputs: list[fx.Node], env) -> fx.Node | None:
    """A node of ``sub`` reading the symbolic size ``placeholder`` holds off one of ``inputs``."""
    value = placeholder.meta.get("val")
    if not isinstance(value, torch.SymInt):
        return None
    for node in inputs:
        shape = getattr(node.meta.get("val"), "shape", ())
        for axis, size in enumerate(shape):
            if isinstance(size, torch.SymInt) and size.node.expr == value.node.expr:
                return sub.call_function(aten.sym_size.int, (env[node], axis))
    return None


def _stitch(gm: fx.GraphModule, launchers: dict[str, Launcher], plan: Plan) -> None:
    """Replace the nodes each kernel computes by a call of its launcher (and, for a
    kernel with several outputs, by the items of the tuple it returns)."""
    import operator

    nodes = {n.name: n for n in gm.graph.nodes}
    for node_name, launcher in launchers.items():
        targets = [nodes[name] for name in plan.nodes_of(node_name)]
        inputs = tuple(nodes[name] for name in launcher.src.inputs)
        first = min(targets, key=lambda n: _position(gm, n))
        last_input = max(inputs, key=lambda n: _position(gm, n), default=None)
        # where the first output was, or after the last input (the back-off placed the
        # kernel there only where every use of its outputs comes later: backoff._place)
        late = last_input is not None and _position(gm, last_input) > _position(gm, first)
        with gm.graph.inserting_after(last_input) if late else gm.graph.inserting_before(first):
            call = gm.graph.call_function(launcher, _on_kernel_device(gm, inputs, targets[0]))
        with gm.graph.inserting_after(call):
            items = [call] if len(targets) == 1 else [gm.graph.call_function(operator.getitem, (call, k))
                                                      for k in reversed(range(len(targets)))][::-1]
        if len(targets) == 1:
            call.meta = dict(targets[0].meta)
        else:
            call.meta = {"val": tuple(t.meta.get("val") for t in targets)}
            for item, target in zip(items, targets):
                item.meta = dict(target.meta)
        for item, target in zip(items, targets):
            target.replace_all_uses_with(item)
            nodes[target.name] = item  # a later kernel reading this value reads this kernel's output
            if late:
                _move_views_after(gm, item)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _on_kernel_device(gm: fx.GraphModule, inputs: tuple[fx.Node, ...], output: fx.Node) -> tuple[fx.Node, ...]:
    """``inputs``, each host scalar among them copied to the device of the kernel's
    ``output`` (nodes inserted where the graph's insertion point is: before the kernel).

    [Note: host scalars]
    With a symbolic head width, ``q * q.shape[-1] ** -0.5`` captures as a 0-dim CPU
    tensor (``scalar_tensor`` of the size, then ``pow``) multiplying a CUDA tensor, which
    PyTorch allows. Flashlight's kernel reads that factor like any other input, through
    a pointer, so the graph copies it to the device first (a 4-byte copy per call); the
    rest of the graph is unchanged. Without this, a function compiled once and called
    with a second head width ran unfused."""
    device = getattr(output.meta.get("val"), "device", None)
    if device is None or device.type == "cpu":
        return inputs
    moved = []
    for node in inputs:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and _host_scalar(value):
            copy = gm.graph.call_function(aten._to_copy.default, (node,), {"device": device})
            copy.meta = {"val": _fake_on(value, device),
                         "flashlight_reason": "a 0-dim CPU input of a kernel, copied to its device"}
            node = copy
        moved.append(node)
    return tuple(moved)


def _fake_on(value: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """The value ``value`` (a fake tensor of the capture) would have on ``device``."""
    mode = getattr(value, "fake_mode", None)
    try:
        with mode if mode is not None else contextlib.nullcontext():
            return value.to(device)
    except Exception:  # noqa: BLE001 - metadata only; the graph runs without it
        return None


def _move_views_after(gm: fx.GraphModule, node: fx.Node) -> None:
    """Move the users of ``node`` that come before it (views only: ``backoff._place``
    allows nothing else there) to just after it, and theirs in turn."""
    anchor = node
    for user in sorted(node.users, key=lambda n: _position(gm, n)):
        if user.op != "output" and _position(gm, user) < _position(gm, node):
            anchor.append(user)
            anchor = user
            _move_views_after(gm, user)


def _position(gm: fx.GraphModule, node: fx.Node) -> int:
    return next(k for k, n in enumerate(gm.graph.nodes) if n is node)


def _record(report: ExplainReport | None, gm: fx.GraphModule, plan: Plan, launchers, reason: str | None = None):
    if report is None:
        return
    report.graphs += 1
    lowered_reasons = getattr(plan, "rejected", {})
    for launcher in launchers.values():
        report.kernels.append(_kernel_report(launcher))
    for node in gm.graph.nodes:
        if node.op != "call_function" or isinstance(node.target, Launcher) or node.target in VIEW_LIKE \
                or isinstance(node.meta.get("val"), torch.SymInt) \
                or _item_of_kernel(node):  # size arithmetic and a kernel's outputs: no tensor work
            continue
        why = reason or lowered_reasons.get(node.name) or _opaque_reason(node) or "not fused into a kernel"
        report.fallback_ops.append(FallbackOp(_op_name(node), why))


def _item_of_kernel(node: fx.Node) -> bool:
    """Whether ``node`` takes one output of a kernel with several."""
    import operator

    return node.target is operator.getitem and isinstance(getattr(node.args[0], "target", None), Launcher)


def _opaque_reason(node: fx.Node) -> str | None:
    from flashlight.sdpa import left_to_pytorch

    return left_to_pytorch(node) or node.meta.get("flashlight_reason")


def _kernel_report(launcher: Launcher) -> KernelReport:
    kernel, precision = launcher.kernel, launcher.src.fp32_precision

    @functools.cache
    def gpu_source():  # what a GPU would run (under the interpreter, dots take float32 operands)
        return generate(launcher.tiled, launcher.src.name, precision, interpret=False)

    def aot(capability: int = 90, **kw):
        dtypes = [out.dtype for out in kernel.outputs()]
        kw.setdefault("specialize", launcher.first_arguments)  # as the JIT built its first launch
        return aot_compile(gpu_source(), list(launcher.input_dtypes), dtypes, capability, **kw)

    gpu_configs = config_space(launcher.src, fma_dots=launcher.tiled.plan.fma_dots(precision))
    return KernelReport(launcher.src.name, launcher.src.source, tuple(launcher.aten_ops),
                        tuple(gpu_configs), aot, launcher.chosen_configs)


def compile_count() -> int:
    """How many Flashlight kernels this process has generated and loaded so far."""
    return len(COMPILE_EVENTS)


KNOWN_OPTIONS = {"autotune", "remainder"}
REMAINDERS = ("inductor", "eager")


def check_options(options: dict[str, Any]) -> None:
    """Raise on an unknown option or remainder (see :func:`make_backend`)."""
    unknown = set(options) - KNOWN_OPTIONS
    if unknown:
        raise TypeError(f"unknown Flashlight options {sorted(unknown)}; known: {sorted(KNOWN_OPTIONS)}")
    if options.get("remainder", "inductor") not in REMAINDERS:
        raise ValueError(f"remainder={options['remainder']!r}: expected one of {', '.join(REMAINDERS)}")


def make_backend(report: ExplainReport | None = None, **options: Any):
    """A ``torch.compile`` backend; ``report`` (if given) collects what was generated.

    Options: ``autotune``; ``remainder``: ``"inductor"`` (Inductor compiles the graph
    around Flashlight's kernels) or ``"eager"``, default ``FLASHLIGHT_REMAINDER``."""
    check_options(options)
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind: str):
        def compile_one(gm: fx.GraphModule, example_inputs):
            return compile_with_remainder(gm, example_inputs, report, options, kind)
        return compile_one

    from flashlight.partition import partition

    captures = {inference: aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                                        inference_compiler=compiler("inference"), partition_fn=partition,
                                        decompositions=decompositions(inference=inference),
                                        # [Note: writing into an input the graph overwrites]
                                        keep_inference_input_mutations=True)
                for inference in (False, True)}

    def backend(gm: fx.GraphModule, example_inputs):
        # SDPA decomposes only where AOTAutograd will trace no backward
        training = _needs_gradients(example_inputs)
        try:
            with _keep_saved_tensors(training and (options.get("remainder") or settings.get("remainder")) == "inductor"):
                return captures[not training](gm, example_inputs)
        except NoKernelInGraph:  # [Note: a graph Flashlight fuses nothing in]
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs)

    return backend


def _keep_saved_tensors(training_through_inductor: bool):
    """Where Inductor compiles a backward graph, AOTAutograd would let it reuse the memory
    of tensors the forward saved for it ("donated buffers"); its default partition saves
    views of one tensor as several (a softmax and its detached copy), and reusing one
    would overwrite the others, so that reuse is switched off for these graphs."""
    if not training_through_inductor:
        return contextlib.nullcontext()
    return torch._functorch.config.patch(donated_buffer=False)


def _needs_gradients(example_inputs) -> bool:
    """Whether AOTAutograd traces a backward for a graph of these inputs (its own test)."""
    leaves = torch.utils._pytree.tree_leaves(list(example_inputs))
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves)


def compile_with_remainder(gm: fx.GraphModule, example_inputs, report: ExplainReport | None,
                           options: dict[str, Any], kind: str = "inference"):
    """:func:`build`, then the remainder: Inductor compiles the graph around the kernels
    (``remainder="inductor"``), or it runs eagerly. An unexpected error inside
    Flashlight's compile steps falls back, with a warning and the reason in the report, to
    the graph without Flashlight kernels (``FLASHLIGHT_ON_ERROR=raise``: it propagates)."""
    from flashlight import inductor, prepare

    prepare.wait(prepare.CAPTURE)  # [Note: a process's one-time costs]

    remainder = options.get("remainder") or settings.get("remainder")
    fallback = settings.get("on_error") == "fallback"
    pristine = fx.GraphModule(gm, copy.deepcopy(gm.graph)) if fallback else None
    start = _report_marks(report)
    to_inductor = remainder == "inductor" and inductor.devices(gm, example_inputs) <= inductor.DEVICES
    try:
        gm = build(gm, example_inputs, report, options, inductor_remainder=to_inductor)
    except Exception as error:  # noqa: BLE001 - any internal failure falls back
        if not fallback:
            raise
        why = _warn_fallback("Flashlight", error, "the graph runs without Flashlight kernels, "
                             + ("eagerly" if remainder == "eager" else "through Inductor"))
        gm = pristine
        _rewind_report(report, start)
        _record(report, gm, Plan({}, {}, None), {}, reason=why)
        if report is not None:
            report.errors.append(why)
    if remainder != "inductor" or not isinstance(gm, fx.GraphModule) \
            or not inductor.devices(gm, example_inputs) <= inductor.DEVICES \
            or (kind == "inference" and not _remainder_computes(gm)):
        return _boxed(gm) if kind == "backward" else gm
    if kind == "inference" and gm is not pristine and not _has_kernels(gm) and not _overwrites_inputs(gm):
        _mark_remainder(report, start, "inductor")
        raise NoKernelInGraph  # [Note: a graph Flashlight fuses nothing in]
    try:
        inductor.to_custom_ops(gm)
        compiled = inductor.compile_remainder(gm, example_inputs, kind)
    except Exception as error:  # noqa: BLE001 - the graph still runs, eagerly
        if not fallback:
            raise
        why = _warn_fallback("Inductor", error, "the rest of the graph runs eagerly around Flashlight's kernels")
        if report is not None:
            report.errors.append(why)
        return _boxed(gm) if kind == "backward" else gm
    _mark_remainder(report, start, "inductor")
    return compiled


# [Note: a graph Flashlight fuses nothing in]
# An inference graph in which Flashlight generated no kernel (no attention in it, or
# every candidate backed off: a latent width wider than a tile) is compiled as
# ``torch.compile`` compiles it: Inductor's ``compile_fx`` on the graph Dynamo captured,
# with Inductor's own decompositions and graph passes. Handing it Flashlight's ATen
# graph instead (its decompositions, without Inductor's joint-graph passes, which exist
# to keep attention patterns for Flashlight) gave the same operations in other kernels:
# absorbed latent attention at 2 x 8 x 2048 x 64 (bf16, H100) ran 0.530 ms against
# ``torch.compile``'s 0.483. The compile step signals this by raising
# :class:`NoKernelInGraph` out of AOTAutograd; the backend catches it. Training graphs
# keep Flashlight's path (their backward is partitioned by Flashlight), and so do graphs
# that update an input in place, whose results Flashlight's path stores in that input's
# buffer ([Note: writing into an input the graph overwrites]).


class NoKernelInGraph(Exception):
    """Raised by the inference compile step of a graph without Flashlight kernels
    ([Note: a graph Flashlight fuses nothing in])."""


def _has_kernels(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` calls a Flashlight kernel."""
    return any(node.op == "call_function" and isinstance(node.target, Launcher) for node in gm.graph.nodes)


def _overwrites_inputs(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` (functionalized) copies a value into one of its inputs."""
    return any(node.target is aten.copy_.default and node.args[0].op == "placeholder" for node in gm.graph.nodes)


def _remainder_computes(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` has work outside Flashlight's kernels besides re-indexing memory.

    A graph that Flashlight fused whole (the attention cores of patched OpenFold modules:
    views around one kernel) gains nothing from Inductor, whose compiled wrapper and the
    opaque launch op would only add host time to every call (about 0.1 ms per call
    measured on a CPU host), so it runs as stitched."""
    import operator

    return any(node.op == "call_function" and not isinstance(node.target, Launcher)
               and node.target not in VIEW_LIKE and node.target is not operator.getitem
               for node in gm.graph.nodes)


def _boxed(gm):
    """``gm`` taking its arguments as one list, as AOTAutograd calls a backward graph."""
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(gm)


def _warn_fallback(who: str, error: Exception, instead: str) -> str:
    """Warn in one line that ``who`` failed on a graph and what runs ``instead``;
    returns the reason."""
    message = " ".join(f"{type(error).__name__}: {error}".split())[:300]
    why = f"{who} failed ({message})"
    warnings.warn(f"{why}; {instead} (FLASHLIGHT_ON_ERROR=raise shows the traceback)", stacklevel=2)
    return why


def _report_marks(report: ExplainReport | None) -> tuple[int, int, int]:
    """How much ``report`` held before a graph: kernels, fallback ops, graphs."""
    return (len(report.kernels), len(report.fallback_ops), report.graphs) if report is not None else (0, 0, 0)


def _rewind_report(report: ExplainReport | None, marks: tuple[int, int, int]) -> None:
    """Drop what a failed :func:`build` recorded of its graph."""
    if report is not None:
        del report.kernels[marks[0]:], report.fallback_ops[marks[1]:]
        report.graphs = marks[2]


def _mark_remainder(report: ExplainReport | None, marks: tuple[int, int, int], runs: str) -> None:
    """Label this graph's fallback ops as run by ``runs``."""
    if report is not None:
        ops = report.fallback_ops
        ops[marks[1]:] = [dataclasses.replace(op, runs=runs) for op in ops[marks[1]:]]


def flashlight_backend(gm: fx.GraphModule, example_inputs):
    """The backend registered as ``torch.compile(..., backend="flashlight")``."""
    return make_backend()(gm, example_inputs)
