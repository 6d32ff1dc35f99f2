"""``bench/core_forms.py`` runs on a CPU (Triton interpreter, the default small shape):
every form of the Evoformer core's kernel is built, launched and timed, and the forms
agree with the form without the base-2 pass."""
from __future__ import annotations

import json

from bench import core_forms


def test_the_forms_run_and_agree(tmp_path):
    out = tmp_path / "forms.json"
    assert core_forms.main(["--device", "cpu", "--dtypes", "tf32", "--out", str(out)]) == 0
    cells = json.loads(out.read_text())["cells"]
    assert [c["form"] for c in cells] == list(core_forms.FORMS)
    assert all(c["ms"] > 0 and len(c["config"]) == 4 for c in cells)
    assert all(c["rel_diff_vs_exp"] < 1e-5 for c in cells[1:])


def test_the_core_terms_are_the_core_and_compile():
    # bench/core_terms.py: "both" is the catalog's core; every term compiles with
    # Flashlight and matches float64 eager (float32 inputs here)
    import torch

    from bench import core_terms
    from bench.variants_core import evoformer_core
    from tests.helpers import matches_float64

    args = core_terms.inputs(3, 19, 2, 16, torch.float32, device="cpu")
    torch.testing.assert_close(core_terms.core("both")(*args), evoformer_core(*args), rtol=0, atol=0)
    for term in core_terms.TERMS:
        matches_float64(core_terms.core(term), args)
