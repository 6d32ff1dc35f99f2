"""Triton compiles in worker processes ([Note: compiling in other processes] in
``flashlight.compile_workers``): a worker compiles a generated kernel for sm_90 into the
Triton cache a job names, a second process finds it there under the same key, a broken
job or worker never loses the caller's compile, and the JIT hook answers only the
launch its thread asked about."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from flashlight import compile_workers, prepare, runtime, triton_specializations
from flashlight.aot import specialization
from tests.test_runtime_tuning import _attention, _built, _inputs


def _cache_groups(folder) -> set[str]:
    return {d for d in os.listdir(folder)} if os.path.isdir(folder) else set()


@pytest.fixture(scope="module")
def kernel_job(tmp_path_factory):
    """A job for the generated attention kernel: its module file and a specialization in
    the serialised form Triton's JIT hands its cache hook."""
    inputs = _inputs(seed=5)
    _, (launcher,) = _built(_attention, *inputs)
    src = launcher.src
    runtime.load_module(src)
    module = next(m for name, m in sys.modules.items()
                  if name.startswith("flashlight_kernel_") and getattr(m, src.name, None) is not None
                  and open(m.__file__).read() == src.source)
    signature, constexprs, attrs = specialization(src, launcher.input_dtypes, torch.float32, 64, 32)
    names = list(signature)
    data = {"name": f"{module.__name__}.{src.name}", "signature": signature,
            "constant_keys": [[names.index(k)] for k in constexprs], "constant_vals": list(constexprs.values()),
            "attrs_keys": [[int(k)] for k in attrs], "attrs_vals": list(attrs.values()),
            "options": {"num_warps": 4, "num_stages": 2}}
    cache = tmp_path_factory.mktemp("triton-cache")
    return {"path": module.__file__, "module": module.__name__, "name": src.name,
            "specialization": json.dumps(data), "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
            "reader": triton_specializations.__file__, "env": {"TRITON_CACHE_DIR": str(cache)}}


def _jit_fn(job):
    return getattr(sys.modules[job["module"]], job["name"])


def test_a_worker_compiles_into_the_named_cache_and_another_process_finds_it_there(kernel_job):
    cache = kernel_job["env"]["TRITON_CACHE_DIR"]
    pool = compile_workers.Pool(1, ("cuda", 90, 32))  # with its warm-up compile
    try:
        phases: dict[str, float] = {}
        with compile_workers.job_phases(phases):  # as a background compile job times it
            result = pool.compile(kernel_job)
        assert result["ok"], result.get("error")
        # waiting for the worker (its warm-up included) and the worker's compile, apart
        assert set(phases) == {"worker_wait_s", "worker_s"} and phases["worker_s"] >= result["seconds"] * 0.9
        groups = _cache_groups(cache)
        files = [f for d in groups for f in os.listdir(os.path.join(cache, d))]
        assert any(f.endswith(".cubin") for f in files), files
        assert not any(f.startswith("warm") for f in files)  # the warm-up's kernel is kept nowhere
        assert pool.stats()["jobs"] == 1 and pool.stats()["failed"] == 0
        # a fresh process, the same job: Triton's cache key is the same, nothing new is written
        again = compile_workers.Pool(1)
        try:
            assert again.compile(kernel_job)["ok"]
        finally:
            again.close()
        assert _cache_groups(cache) == groups
    finally:
        pool.close()


def test_a_failing_job_reports_its_error_and_the_worker_serves_the_next(kernel_job):
    pool = compile_workers.Pool(1)
    try:
        broken = {**kernel_job, "name": "no_such_kernel"}
        result = pool.compile(broken)
        assert not result["ok"] and "no_such_kernel" in result["error"]
        assert pool.compile(kernel_job)["ok"]
        assert pool.stats()["jobs"] == 2 and pool.stats()["failed"] == 1
    finally:
        pool.close()


def test_a_dead_worker_is_replaced_and_its_job_reported(kernel_job):
    pool = compile_workers.Pool(1)
    try:
        (worker,) = pool._all
        worker.proc.kill()
        worker.proc.wait()
        with pytest.raises(compile_workers.WorkerError):
            pool.compile(kernel_job)
        assert pool.compile(kernel_job)["ok"]  # the replacement
    finally:
        pool.close()


class _Info:
    def __init__(self, fn):
        self.jit_function = fn


def test_the_hook_answers_only_the_launch_its_thread_asked_about(monkeypatch):
    seen = []
    monkeypatch.setattr(compile_workers, "_previous_hook", lambda **kw: seen.append(kw["fn"]) or None)
    wanted, other = object(), object()
    compile_data = {"specialization_data": '{"x": 1}'}
    # nobody asked: the earlier hook decides, Triton compiles
    assert compile_workers._hook(fn=_Info(wanted), compile=compile_data) is None
    compile_workers._PROBE.jit_fn = wanted
    try:
        assert compile_workers._hook(fn=_Info(other), compile=compile_data) is None
        assert compile_workers._hook(fn=_Info(wanted), compile=compile_data) is True
        assert compile_workers._PROBE.found == '{"x": 1}'
    finally:
        compile_workers._PROBE.jit_fn = None
    assert len(seen) == 2


def test_without_workers_the_caller_compiles(monkeypatch):
    monkeypatch.setattr(compile_workers, "_pool", None)
    assert compile_workers.compile_elsewhere(object(), (), (1,), {}) is False
    assert compile_workers.start() is None  # the interpreter / no CUDA device: no workers


def test_the_workers_share_the_cores_among_a_nodes_processes(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    from flashlight import settings

    with settings.override(compile_processes=-1):
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        assert compile_workers.wanted_processes() == 8  # one per core, at most 8
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
        assert compile_workers.wanted_processes() == 4  # 16 cores among 4 ranks
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
        assert compile_workers.wanted_processes() == 1
    with settings.override(compile_processes=0):
        assert compile_workers.wanted_processes() == 0


def test_waiting_for_the_workers_warm_up_then_compiling(kernel_job, monkeypatch):
    pool = compile_workers.Pool(2, ("cuda", 90, 32))
    try:
        monkeypatch.setattr(compile_workers, "_pool", pool)
        compile_workers.wait_ready()  # what a comparison does before timing
        assert all(worker.ready for worker in pool._all)
        assert pool.compile(kernel_job)["ok"]  # the ready message is not taken for a result
    finally:
        pool.close()


def test_the_launcher_is_built_beside_the_compile_from_the_specialization(kernel_job, monkeypatch):
    """[Note: the launcher beside the compile]: the launcher class gets the launch's own
    signature and constants; a failing build costs the caller nothing."""
    built = []

    class Recording:
        def __init__(self, src, metadata):
            built.append((src, metadata))

    monkeypatch.setattr(compile_workers, "_launcher_cls", lambda: Recording)
    times: dict[str, float] = {}
    with compile_workers.job_phases(times):
        compile_workers.build_launcher_beside(_jit_fn(kernel_job), kernel_job["specialization"],
                                              kernel_job["target"]).join()
    ((src, metadata),) = built
    data = json.loads(kernel_job["specialization"])
    assert src.fn is _jit_fn(kernel_job) and src.signature == data["signature"]
    assert {k: int(v) for k, v in src.constants.items()} == \
        {tuple(k): v for k, v in zip(data["constant_keys"], data["constant_vals"])}
    assert metadata.tensordesc_meta is None and times["launcher_beside_s"] >= 0

    def failing():
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(compile_workers, "_launcher_cls", failing)
    compile_workers.build_launcher_beside(_jit_fn(kernel_job), kernel_job["specialization"],
                                          kernel_job["target"]).join()  # logged, nothing raised


def test_the_first_launch_question_is_asked_ahead_only_where_workers_run(monkeypatch):
    """[Note: a process's one-time costs] in ``flashlight.prepare``: Triton is asked once
    what a small kernel would compile, with a pointer that points nowhere (no memory, no
    device context), and only where a compile worker's job would ask it."""
    asked = []
    monkeypatch.setattr(compile_workers, "specialization",
                        lambda fn, args, grid, options: asked.append((fn, args, grid, options)))
    monkeypatch.setattr(compile_workers, "pool", lambda: None)
    prepare._triton_launch()
    assert asked == []
    monkeypatch.setattr(compile_workers, "pool", lambda: object())
    prepare._triton_launch()
    ((fn, args, grid, options),) = asked
    assert "flashlight_probe" in str(getattr(fn, "fn", fn)) and options == {"BLOCK": 16} and grid == (1,)
    assert all(a.data_ptr() == 0 and a.dtype == torch.float32 for a in args)


def test_a_jobs_environment_is_not_the_next_jobs(kernel_job, tmp_path, monkeypatch):
    """A job that names its own Triton cache (a build timed from nothing, say) leaves the
    worker's own cache in place for the jobs after it."""
    own, timed = tmp_path / "own", tmp_path / "timed"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(own))  # the worker's environment at its start
    pool = compile_workers.Pool(1)
    try:
        first = {**kernel_job, "env": {"TRITON_CACHE_DIR": str(timed)}}
        spec = json.loads(kernel_job["specialization"])
        spec["options"] = {**spec["options"], "num_stages": 3}  # another build: nothing cached
        second = {**kernel_job, "specialization": json.dumps(spec), "env": {}}
        assert pool.compile(first)["ok"] and pool.compile(second)["ok"]
    finally:
        pool.close()
    assert len(_cache_groups(timed)) == 1 and len(_cache_groups(own)) == 1
