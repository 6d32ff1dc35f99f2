"""The compiler's output for a few catalog variants, compared with ``tests/golden/``.

Each variant's IR after every pass and its generated GPU source must equal the
committed files; a change that alters them on purpose rewrites them with
``python -m tests.golden --update`` (then read ``git diff tests/golden``). Dim names
are numbered per compile, so the text does not depend on what ran before.
"""
from __future__ import annotations

import difflib
import os

import pytest

from tests import golden

EXPECTED = sorted(os.listdir(golden.GOLDEN_DIR)) if os.path.isdir(golden.GOLDEN_DIR) else []


@pytest.fixture(scope="module")
def actual() -> dict[str, str]:
    return golden.golden_files()


def test_golden_files_cover_the_variants(actual):
    assert sorted(actual) == EXPECTED, "golden files differ in number: run python -m tests.golden --update"


@pytest.mark.parametrize("file", EXPECTED)
def test_matches_golden(file, actual):
    with open(os.path.join(golden.GOLDEN_DIR, file)) as f:
        expected = f.read()
    got = actual.get(file, "")
    if got != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), got.splitlines(True), "golden", "now", n=2))
        pytest.fail(f"{file} differs from tests/golden (python -m tests.golden --update rewrites it):\n{diff[:4000]}")


def test_compiling_twice_prints_the_same_ir():
    first = golden.ir_trace("vanilla", golden.DTYPES["fp32"])
    assert "d" in first and first == golden.ir_trace("vanilla", golden.DTYPES["fp32"])
