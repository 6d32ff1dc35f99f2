"""Kernels compiled on threads while their unfused graphs answer ([Note: compiling in the
background] in ``flashlight.background``): the jobs, the launcher's use of them, and the
stock-or-kernel timing of patched OpenFold calls deferred to the context's end."""
from __future__ import annotations

import logging
import threading

import pytest
import torch

from flashlight import background, runtime
from flashlight.integrations import openfold_choice
from tests.helpers import stand_in_variants
from tests.test_runtime_tuning import _attention, _built, _inputs

CPU = torch.device("cpu")
CHOICE = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}


def test_each_key_compiles_once_and_deferred_calls_run_after_every_job():
    order: list[str] = []
    with background.compiling_in_background(threads=2) as compiles:
        assert background.active() is compiles
        for x in (1, 2, 1, 1):
            compiles.submit(x, lambda x=x: order.append(f"job {x}"))
            compiles.after(x, lambda x=x: order.append(f"after {x}"))
    assert background.active() is None
    assert sorted(order[:2]) == ["job 1", "job 2"] and sorted(order[2:]) == ["after 1", "after 2"]
    assert set(compiles.jobs()) == {1, 2} and all(job.done() for job in compiles.jobs().values())
    timeline = compiles.timeline()  # one entry per job, in submission order, times non-decreasing
    assert [t["kernel"] for t in timeline] == ["1", "2"]
    assert all(0 <= t["submitted_s"] <= t["started_s"] <= t["finished_s"] for t in timeline)


def test_a_failed_job_is_logged_and_an_error_inside_cancels_and_leaves_none_active(caplog):
    def broken():
        raise RuntimeError("no kernel today")

    with caplog.at_level(logging.WARNING, logger="flashlight"):
        with background.compiling_in_background() as compiles:
            compiles.submit("k", broken)
    assert "no kernel today" in caplog.text
    with pytest.raises(ValueError):
        with background.compiling_in_background():
            with pytest.raises(RuntimeError, match="already active"):
                with background.compiling_in_background():
                    pass
            raise ValueError("the pass failed")
    assert background.active() is None


@pytest.fixture
def launcher_call(monkeypatch):
    """A real launcher, its arguments, and a compile that waits for a go signal."""
    inputs = _inputs(seed=3)
    _, (launcher,) = _built(_attention, *inputs)
    go, compiled = threading.Event(), []

    def compile_(args, grid, chosen, device):
        go.wait(5)
        compiled.append(dict(chosen))
        return chosen

    monkeypatch.setattr(launcher, "_compile", compile_)
    monkeypatch.setattr(launcher, "_known_choice", lambda device, sizes, eager_ok: (CHOICE, "shipped"))
    launcher._jit(interpret=True)
    return launcher, list(inputs), go, compiled


def _ask(launcher, inputs):
    return launcher._compiled_in_background((), None, (7,), CPU, inputs)


def test_a_launch_answers_through_its_graph_until_its_compile_is_done(launcher_call):
    launcher, inputs, go, compiled = launcher_call
    with background.compiling_in_background() as compiles:
        assert _ask(launcher, inputs) == runtime._COMPILING
        assert _ask(launcher, inputs) == runtime._COMPILING  # still compiling: not submitted again
        go.set()
        next(iter(compiles.jobs().values())).result(timeout=5)
        assert _ask(launcher, inputs) == CHOICE
    assert compiled == [CHOICE]


@pytest.mark.parametrize("tuning_fails", [False, True])
def test_a_launch_without_a_known_choice_builds_its_candidates_and_tunes_when_the_context_settles(
        launcher_call, monkeypatch, caplog, tuning_fails):
    """[Note: autotuning in the background]: the candidates compile on the context's pool
    while the graph answers; the timing waits for the settle, where nothing else runs; a
    failed timing is logged and the launch then tunes in place."""
    launcher, inputs, go, _ = launcher_call
    monkeypatch.setattr(launcher, "_known_choice", lambda device, sizes, eager_ok: (None, None))
    built, tuned = [], []

    def precompile(jit_fn, configs, args, grid, extra=None):
        go.wait(5)
        built.append(len(configs))

    def first_launch(fn, args, grid, sizes, device, tune, eager_inputs=None, wide=None):
        tuned.append((sizes, tune, eager_inputs is not None))
        if tuning_fails:
            raise RuntimeError("out of resources")
        launcher._chosen[sizes] = CHOICE

    monkeypatch.setattr(runtime, "precompile", precompile)
    monkeypatch.setattr(launcher, "_first_launch", first_launch)
    with caplog.at_level(logging.WARNING, logger="flashlight"):
        with background.compiling_in_background() as compiles:
            assert _ask(launcher, inputs) == runtime._COMPILING
            go.set()
            next(iter(compiles.jobs().values())).result(timeout=5)
            assert built and not tuned  # built, not timed: other work may be running
            assert _ask(launcher, inputs) == runtime._COMPILING
            compiles.settle()
            assert tuned == [((7,), True, True)]
            assert _ask(launcher, inputs) == (None if tuning_fails else CHOICE)
    assert len(tuned) == 1  # once, at the settle
    assert ("out of resources" in caplog.text) == tuning_fails


@pytest.mark.parametrize("case", ["the graph was chosen", "no graph", "failed compile"])
def test_a_launch_compiles_in_place_where_the_background_cannot_help(launcher_call, monkeypatch, case):
    launcher, inputs, go, _ = launcher_call
    go.set()
    if case == "the graph was chosen":
        monkeypatch.setattr(launcher, "_known_choice", lambda device, sizes, eager_ok: (runtime.EAGER, "shipped"))
    elif case == "no graph":
        monkeypatch.setattr(launcher, "eager", None)
    else:
        monkeypatch.setattr(launcher, "_compile", lambda *a: 1 / 0)
    with background.compiling_in_background() as compiles:
        first = _ask(launcher, inputs)
        if case == "failed compile":
            assert first in (runtime._COMPILING, None)  # None once the job has failed
            next(iter(compiles.jobs().values())).exception(timeout=5)
            first = _ask(launcher, inputs)
        assert first is None


def test_the_graph_answers_while_compiling_and_matches_the_kernel(monkeypatch):
    """What a launch returns while its kernel compiles is the kernel's value, in its layout."""
    inputs = _inputs(seed=4)
    gm, (launcher,) = _built(_attention, *inputs)
    seen = []
    launch = runtime.Launcher.__call__
    monkeypatch.setattr(runtime.Launcher, "__call__", lambda self, *t: seen.append(t) or launch(self, *t))
    gm(*inputs)
    want = launch(launcher, *seen[0])  # the interpreter runs the kernel
    got = launcher._run_eager(seen[0])
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_small_patched_call_is_timed_when_the_context_closes():
    openfold_choice.clear()
    patched, stock = stand_in_variants([])
    timer = lambda fn: 1.0 if fn is patched else 0.5  # noqa: E731 - stock measured faster
    with background.compiling_in_background():
        outs = [float(openfold_choice.run("shape", 10, patched, stock, timer=timer)) for _ in range(2)]
        assert outs == [1.0, 1.0] and openfold_choice.choices() == {}
    assert openfold_choice.choices() == {"shape": "stock"} and len(openfold_choice.TIMINGS) == 1
    assert float(openfold_choice.run("shape", 10, patched, stock, timer=timer)) == 2.0
    openfold_choice.clear()


def test_the_background_job_builds_the_launcher_too(launcher_call, monkeypatch):
    """The job compiles the chosen configuration and reads the compiled kernel's ``run``
    (Triton then builds its launcher and loads the binary), not the first launch."""
    launcher, inputs, _, _ = launcher_call
    monkeypatch.undo()  # the real _compile, over a stand-in JIT function
    touched: list[str] = []

    class Compiled:
        @property
        def run(self):
            touched.append("run")
            return lambda *a: None

    class Jit:
        def warmup(self, *args, grid, **config):
            touched.append(f"warmup {config['BLOCK_M']}")
            return Compiled()

    launcher._raw = Jit()
    assert launcher._compile((), None, dict(CHOICE), CPU) == CHOICE
    assert touched == ["warmup 64", "run"]
    # inside a background context the job's timeline names its phases
    with background.compiling_in_background(threads=1) as compiles:
        compiles.submit("k", lambda: launcher._compile((), None, dict(CHOICE), CPU))
    (timed,) = compiles.timeline()
    assert {"prepare_wait_s", "compile_s", "launcher_s"} <= set(timed)  # no worker on the CPU: compiled here
    assert all(timed[k] >= 0 for k in ("prepare_wait_s", "compile_s", "launcher_s"))


def test_deferred_calls_run_outside_the_context():
    seen = []
    with background.compiling_in_background() as compiles:
        compiles.after("k", lambda: seen.append(background.active()))
    assert seen == [None]


def test_settle_waits_for_the_jobs_so_far_and_runs_the_deferred_calls_once():
    order: list[str] = []
    released = threading.Event()
    with background.compiling_in_background(threads=2) as compiles:
        compiles.submit("slow", lambda: (released.wait(10), order.append("slow")))
        compiles.after("choice", lambda: order.append("after"))
        threading.Timer(0.1, released.set).start()
        waited = background.settle()
        assert order == ["slow", "after"] and waited > 0.05 and compiles.settle_s == waited
        compiles.submit("late", lambda: order.append("late"))
    assert order == ["slow", "after", "late"]  # the deferred call ran once
    assert background.settle() == 0.0  # no context: nothing to wait for
