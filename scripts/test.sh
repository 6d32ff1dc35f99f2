#!/usr/bin/env bash
# Run the test suite (setting up .venv first if anything is missing).
#
#   bash scripts/test.sh                 # all tests
#   bash scripts/test.sh -k openfold -x  # extra arguments go to pytest
#
# Generated Triton kernels run on the CPU through Triton's interpreter
# (TRITON_INTERPRET=1), so no GPU is needed. Test files run in parallel, one pytest
# worker per CPU core (pytest-xdist; a file's tests stay on one worker, so they share
# its fixtures; the longest files start first: tests/conftest.py), each worker with
# one intra-op thread so that the workers do not oversubscribe the cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --relax  # the tests cover --relax too
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
TRITON_INTERPRET=1 exec .venv/bin/python -m pytest -q --durations=30 -n auto --dist loadfile --no-loadscope-reorder tests "$@"
