"""Synthetic fold inputs for timing: a FASTA record and, optionally, a deep A3M alignment.

    python -m flashlight.structures.examples.make_synthetic --length 512 --depth 5632 --out inputs/
    flashlight-fold inputs/synthetic_512.fasta --alignment-dir inputs --compare

writes ``synthetic_<length>.fasta`` and, with ``--depth``, ``synthetic_<length>.a3m``.

The sequence is drawn from natural amino-acid frequencies (UniProt's composition); a
given length and seed always give the same record and alignment. The alignment's rows are homologues of the
query drawn the way the end-to-end benchmark draws its MSA features
(``bench/evoformer_inputs.py``: random residues with a few per cent deletions), but
kept close enough to the query to look like a real family: each row keeps a random
40-90% of the query's residues, substitutes the rest, and has short gap runs ('-') and
a few insertions (lower case, which A3M drops from the alignment). The default depth,
5632, is model_1's 512 cluster rows plus its 5120 extra rows, so a fold at the MSA's
depth uses every MSA row of the preset.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

AMINO_ACIDS = "ARNDCQEGHILKMFPSTWYV"
# UniProtKB/Swiss-Prot amino-acid composition, per cent, in AMINO_ACIDS order
FREQUENCIES = np.array([8.25, 5.53, 4.06, 5.45, 1.37, 3.93, 6.75, 7.07, 2.27, 5.96,
                        9.66, 5.84, 2.42, 3.86, 4.70, 6.56, 5.34, 1.08, 2.92, 6.87])
PRESET_DEPTH = 512 + 5120


def sequence(length: int, seed: int) -> str:
    """A random sequence of ``length`` residues with natural amino-acid frequencies."""
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(AMINO_ACIDS), size=length, p=FREQUENCIES / FREQUENCIES.sum())
    return "".join(AMINO_ACIDS[i] for i in picks)


def homologue(query: str, rng: np.random.Generator) -> str:
    """One A3M row for ``query``: substitutions, gap runs and lower-case insertions."""
    n = len(query)
    identity = rng.uniform(0.4, 0.9)
    row = np.array(list(query))
    changed = rng.random(n) > identity
    row[changed] = rng.choice(list(AMINO_ACIDS), size=int(changed.sum()),
                              p=FREQUENCIES / FREQUENCIES.sum())
    for _ in range(rng.integers(0, 4)):  # gap runs
        start = rng.integers(0, n)
        row[start:start + rng.integers(1, 12)] = "-"
    text = list(row)
    for _ in range(rng.integers(0, 3)):  # insertions after a column
        at = int(rng.integers(1, n))
        text[at - 1] += "".join(rng.choice(list(AMINO_ACIDS.lower()), size=rng.integers(1, 4)))
    return "".join(text)


def alignment(query: str, depth: int, seed: int) -> str:
    """A3M text with the query first and ``depth - 1`` distinct homologues."""
    rng = np.random.default_rng(seed + 1)
    rows, seen = [query], {query}
    while len(rows) < depth:
        row = homologue(query, rng)
        if row not in seen:
            seen.add(row)
            rows.append(row)
    return "".join(f">row_{i}\n{row}\n" if i else f">query\n{row}\n" for i, row in enumerate(rows))


def write(out_dir: str, length: int, depth: int | None, seed: int) -> list[str]:
    """Write the FASTA record (and the A3M with ``depth`` rows); returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    name = f"synthetic_{length}"
    query = sequence(length, seed)
    fasta = os.path.join(out_dir, f"{name}.fasta")
    lines = [query[i:i + 60] for i in range(0, length, 60)]
    with open(fasta, "w") as handle:
        handle.write(f">{name} synthetic {length}-residue sequence drawn from natural amino-acid "
                     f"frequencies (seed {seed}), for timing\n" + "\n".join(lines) + "\n")
    paths = [fasta]
    if depth:
        a3m = os.path.join(out_dir, f"{name}.a3m")
        with open(a3m, "w") as handle:
            handle.write(alignment(query, depth, seed))
        paths.append(a3m)
    return paths


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--depth", type=int, default=PRESET_DEPTH,
                   help=f"A3M rows, query included (default {PRESET_DEPTH}; 0: no alignment)")
    p.add_argument("--seed", type=int, help="default: the length")
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    for path in write(args.out, args.length, args.depth, args.length if args.seed is None else args.seed):
        print(path)


if __name__ == "__main__":
    main()
