"""The attention variants Flashlight is built for, written the way their users write them.

Each :class:`Variant` bundles

- ``fn``: the computation in plain PyTorch (no Flashlight helpers), ``fn(*inputs)``;
- ``make_inputs(shape, dtype, device, generator)``: fresh random inputs for a shape dict
  (normal values for floating tensors; masks random, with some positions masked and
  never a fully masked row);
- ``default_shape``: a small shape for CPU tests, lengths not multiples of any tile size;
- ``bench_shapes``: realistic GPU shapes (AlphaFold2 sizes for the Evoformer variants,
  lengths 256..16k for language-model variants, the paper's configurations);
- ``flops(shape)``: useful forward FLOPs, ``2 * batch * Lq * Lkv * (D + Dv)`` for the two
  contractions (``4 * B * H * L * L * D`` when ``Dv == D``), scaled by the fraction of
  (query, key) pairs a mask keeps (causal: one half);
- ``flex``: the same computation through one ``flex_attention`` call (``score_mod`` /
  ``block_mask``), plus the plain PyTorch layout changes and gating around it; ``None``
  when one call cannot express it;
- ``sdpa``: the same through ``F.scaled_dot_product_attention`` with a float bias or a
  bool mask; ``None`` when it cannot express it.

Shape dict keys: ``B`` batch, ``H`` heads (``Hkv`` key/value heads), ``L`` sequence length,
``Lq``/``Lkv`` query/key lengths, ``D`` query/key head dim, ``Dv`` value head dim,
``P`` prefix length, ``n_docs`` documents per packed sequence; Evoformer: ``S`` MSA
sequences, ``L`` residues, ``N`` residues of the pair representation, ``c`` head dim;
global column attention: ``R`` residues (columns), ``C`` the MSA channels.

A variant may return several tensors (``attention_lse``: the output and the row
log-sum-exp); :func:`bench.variants_base.as_outputs` gives any result as a tuple.

Tensor shapes are noted as ``# [B, H, L, D]``. ``fn`` must accept inputs in any dtype
(the tests evaluate it in float64 as the reference), so constants it creates either
take the inputs' dtype or are float32 tensors that type promotion absorbs.
"""
from __future__ import annotations

from bench.variants_base import Variant, sdpa_any_batch
from bench.variants_core import CORE_VARIANTS
from bench.variants_evoformer import EVOFORMER_VARIANTS
from bench.variants_general import GENERAL_VARIANTS
from bench.variants_lm import LM_VARIANTS

__all__ = ["VARIANTS", "Variant", "sdpa_any_batch"]

VARIANTS: dict[str, Variant] = {
    v.name: v for v in (*LM_VARIANTS, *EVOFORMER_VARIANTS, *CORE_VARIANTS, *GENERAL_VARIANTS)
}
