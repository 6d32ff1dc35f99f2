"""Test-wide setup.

- Generated Triton kernels run on CPU tensors through Triton's interpreter unless the
  caller chose otherwise: ``TRITON_INTERPRET`` must be set before Triton is imported,
  so it is set here, before any test module is collected.
- Flashlight's cache folder is a new temporary folder for the run.
- The remainder of a graph runs eagerly (``FLASHLIGHT_REMAINDER=eager``) and errors
  inside Flashlight's compile steps raise (``FLASHLIGHT_ON_ERROR=raise``), unless the
  caller chose otherwise.
- The repository root goes on ``sys.path`` so that tests can import helpers from the
  ``bench`` folder (``import bench...``).
- Files whose tests take minutes on a 2-core machine run first (:data:`LONG_FILES`), so
  that the parallel workers (``scripts/test.sh``: one file per worker at a time, xdist's
  ``--dist loadfile --no-loadscope-reorder``) do not end with one of them alone.
- Fixtures shared by several test files: ``gen`` (a generator with a fresh seed per test,
  printed; ``FLASHLIGHT_TEST_SEED`` replays one) and ``fresh_openfold_warnings``.
"""
import os
import random
import sys
import tempfile

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
# the suite runs the remainder eagerly (Inductor's C++ builds would slow it down; the
# tests of the Inductor remainder choose it themselves), and internal errors raise
os.environ.setdefault("FLASHLIGHT_REMAINDER", "eager")
os.environ.setdefault("FLASHLIGHT_ON_ERROR", "raise")
# generated kernels, tuning choices and traced graphs go to a folder of this run, so
# that no test reads what an earlier run (or another checkout) left in the user's cache
os.environ.setdefault("FLASHLIGHT_CACHE_DIR", tempfile.mkdtemp(prefix="flashlight-tests-"))
# no preloads on threads behind the tests' backs (on a GPU, a test patching a model would
# run the cores earlier tests compiled); the tests of preloading switch it on themselves
os.environ.setdefault("FLASHLIGHT_PRELOAD", "0")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# the longest files first, longest first (measured: the trained and block-scoped OpenFold
# files spend minutes in module fixtures and the Triton interpreter); then the others by
# their number of tests, most first
LONG_FILES = (
    "test_openfold_block_scope.py", "test_openfold_training.py", "test_openfold_patch_model.py",
    "test_variants.py", "test_backward.py", "test_symbolic_sizes.py", "test_openfold_global.py",
    "test_compiler.py", "test_bench_smoke.py",
)


def pytest_collection_modifyitems(session, config, items):
    """Run the files of :data:`LONG_FILES` first, then the rest by test count; a file's
    own tests keep their order."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.path.name] = counts.get(item.path.name, 0) + 1

    def rank(item):
        name = item.path.name
        return (LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES), -counts[name], name)

    items.sort(key=rank)  # stable: a file's tests stay in order


@pytest.fixture
def gen():
    """A ``torch.Generator`` seeded afresh for each test (printed, so a failure can be
    replayed with ``FLASHLIGHT_TEST_SEED``): inputs are never the same fixed values."""
    import torch

    seed = int(os.environ.get("FLASHLIGHT_TEST_SEED") or random.SystemRandom().randrange(2**31))
    print(f"FLASHLIGHT_TEST_SEED={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def fresh_openfold_warnings():
    """The OpenFold patch's one-time warnings can be given again inside the test."""
    from flashlight.integrations import openfold

    openfold.reset_warnings()
    yield
    openfold.reset_warnings()
