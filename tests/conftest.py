"""Test-wide setup.

- Generated Triton kernels run on CPU tensors through Triton's interpreter unless the
  caller chose otherwise: ``TRITON_INTERPRET`` must be set before Triton is imported,
  so it is set here, before any test module is collected.
- The repository root goes on ``sys.path`` so that tests can import helpers from the
  ``bench`` folder (``import bench...``).
"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
