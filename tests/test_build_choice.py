"""[Note: a choice that builds fast] in ``flashlight.tuned_configs``: tuning for the
shipped data records each candidate's time and build seconds, an entry ships the
fastest-building candidate near the fastest, and a compile worker times a candidate's
build from nothing."""
from __future__ import annotations

import json
import math
import os
import sys

import pytest
import torch
import triton

from flashlight import aot, compile_workers, runtime, settings, triton_specializations, tuned_configs
from tests.helpers import FakeJit, FakeTuner
from tests.test_runtime_tuning import CPU, _attention, _built, _inputs, _two_configs


def _measured(*rows):
    return [{"config": dict(zip(tuned_configs.CONFIG_KEYS, key)), "ms": ms, "build_s": build}
            for key, ms, build in rows]


def test_the_fastest_building_candidate_near_the_fastest_is_chosen():
    slow_build, quick_build, quicker_but_slow = (64, 128, 4, 2), (64, 32, 4, 3), (32, 32, 4, 2)
    rows = _measured((slow_build, 1.00, 2.1), (quick_build, 1.02, 0.5), (quicker_but_slow, 1.10, 0.3))
    assert tuned_configs.quick_build_choice(rows) == dict(zip(tuned_configs.CONFIG_KEYS, quick_build))
    # beyond the tolerance, only the fastest is near; without build times, nothing is decided
    assert tuned_configs.quick_build_choice(rows, tolerance=0.01) == dict(zip(tuned_configs.CONFIG_KEYS, slow_build))
    assert tuned_configs.quick_build_choice(_measured((slow_build, 1.0, None), (quick_build, 1.0, None))) is None
    # one near candidate's build unknown (the fastest's, say): nothing to weigh it against
    assert tuned_configs.quick_build_choice(_measured((slow_build, 1.0, None), (quick_build, 1.01, 0.5))) is None
    # a candidate whose time is not a number never sets the bar nor wins
    rows = _measured((slow_build, math.nan, 0.1), (quick_build, 1.0, 0.5))
    assert tuned_configs.quick_build_choice(rows) == dict(zip(tuned_configs.CONFIG_KEYS, quick_build))
    assert tuned_configs.quick_build_choice([]) is None


def _event(choice, measured):
    return {"gpu": "NVIDIA H200", "triton": "3.6", "signature": "sig", "bucket": "rows 256 | keys 256 | grid 8",
            "choice": choice, "kernel_ms": 1.0, "eager_ms": 4.0, "candidates": len(measured),
            "measured_candidates": measured}


def test_an_entry_ships_the_quick_build_and_keeps_the_fastest_beside_it():
    fastest = dict(zip(tuned_configs.CONFIG_KEYS, (64, 128, 4, 2)))
    rows = _measured((tuple(fastest.values()), 1.00, 2.1), ((64, 32, 4, 3), 1.02, 0.5))
    entry = tuned_configs.entry_from_event(_event(fastest, rows), measured=["a cell"])
    assert entry["choice"] == {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3}
    assert entry["fastest"] == fastest
    assert entry["candidates_measured"] == [[64, 128, 4, 2, 1.0, 2.1], [64, 32, 4, 3, 1.02, 0.5]]
    # the unfused graph's choice stands; an event without build times ships the fastest
    assert tuned_configs.entry_from_event(_event("eager", rows))["choice"] == "eager"
    plain = tuned_configs.entry_from_event(_event(fastest, []))
    assert plain["choice"] == fastest and "fastest" not in plain and "candidates_measured" not in plain


def test_tuning_with_recorded_builds_notes_every_candidates_time_and_build(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHLIGHT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "precompile", lambda *a: 1)
    timed = []

    def build_seconds(jit_fn, args, grid, configs, extra=None):
        timed.append(len(configs))
        return {tuned_configs.config_key(c.all_kwargs()): s for c, s in zip(configs, (0.5, 2.0))}

    monkeypatch.setattr(compile_workers, "build_seconds", build_seconds)
    _, (launcher,) = _built(_attention, *_inputs())
    for record in (False, True):
        tuner = FakeTuner(_two_configs())  # its best: the last candidate (128 x 32)
        tuner.configs_timings = {tuner.configs[0]: [1.02, 0.9, 1.1], tuner.configs[1]: [1.0, 0.9, 1.1]}
        launcher._chosen, launcher._build_s, launcher._raw = {}, {}, FakeJit()
        with settings.override(record_builds=record, tuning_cache=False, tuned_configs="0"):
            launcher._first_launch(tuner, ("args",), None, (), CPU, True)
        event = runtime.TUNING_EVENTS[-1]
        assert [m["ms"] for m in event["measured_candidates"]] == [1.02, 1.0]  # the medians
        assert [m["build_s"] for m in event["measured_candidates"]] == ([0.5, 2.0] if record else [None, None])
    assert timed == [2]  # built from nothing only when asked: tuning for the shipped data
    entry = tuned_configs.entry_from_event(event)
    assert entry["choice"]["BLOCK_M"] == 64 and entry["fastest"]["BLOCK_M"] == 128


def test_a_worker_times_each_candidates_build_from_an_empty_cache(monkeypatch, tmp_path):
    _, (launcher,) = _built(_attention, *_inputs(seed=3))
    src = launcher.src
    runtime.load_module(src)
    module = next(m for name, m in sys.modules.items()
                  if name.startswith("flashlight_kernel_") and getattr(m, src.name, None) is not None
                  and open(m.__file__).read() == src.source)
    jit_fn = getattr(module, src.name)
    shared_cache = tmp_path / "shared"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(shared_cache))

    def spec(fn, args, grid, options):  # what Triton's JIT hands its hook, for each candidate
        if options["num_warps"] == 3:
            return None  # already compiled in this process: not timed
        signature, constexprs, attrs = aot.specialization(src, launcher.input_dtypes, torch.float32,
                                                          options["BLOCK_M"], options["BLOCK_N"])
        names = list(signature)
        return json.dumps({"name": f"{module.__name__}.{src.name}", "signature": signature,
                           "constant_keys": [[names.index(k)] for k in constexprs],
                           "constant_vals": list(constexprs.values()),
                           "attrs_keys": [[int(k)] for k in attrs], "attrs_vals": list(attrs.values()),
                           "options": {"num_warps": options["num_warps"], "num_stages": options["num_stages"]}})

    pool = compile_workers.Pool(2, ("cuda", 90, 32))
    try:
        monkeypatch.setattr(compile_workers, "start", lambda: pool)
        monkeypatch.setattr(compile_workers, "specialization", spec)
        configs = [triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2),
                   triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=2, num_stages=1),
                   triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=3, num_stages=2)]
        seconds = compile_workers.build_seconds(jit_fn, (), None, configs)
    finally:
        pool.close()
    assert set(seconds) == {(64, 32, 4, 2), (32, 32, 2, 1)}
    assert all(0 < s < 120 for s in seconds.values())
    assert not shared_cache.exists() or not os.listdir(shared_cache)  # each built where nothing was cached
    monkeypatch.setattr(compile_workers, "start", lambda: None)  # no workers: nothing timed
    assert compile_workers.build_seconds(jit_fn, (), None, configs) == {}
