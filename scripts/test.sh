#!/usr/bin/env bash
# Run the test suite (setting up .venv first if anything is missing).
#
#   bash scripts/test.sh                 # all tests
#   bash scripts/test.sh -k openfold -x  # extra arguments go to pytest
#
# Generated Triton kernels run on the CPU through Triton's interpreter
# (TRITON_INTERPRET=1), so no GPU is needed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
TRITON_INTERPRET=1 exec .venv/bin/python -m pytest -q tests "$@"
