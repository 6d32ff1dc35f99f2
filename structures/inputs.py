"""Reading and validating folding inputs: FASTA records and their optional MSAs.

Everything is checked before any model is built, so that a typo in record 900 does not
surface after hours of folding. Each problem names the file, the record and, where it
applies, the 1-based residue position::

    inputs/batch.fasta: record 'p3' (#3): invalid residue '*' at position 41

:func:`load_inputs` returns the valid records and the problems found; the caller decides
whether problems are fatal (the default) or listed and skipped (``--skip-invalid``).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Iterable, List, Optional, Sequence, Tuple

from Bio import SeqIO

# One-letter codes accepted in a query sequence: the 20 standard amino acids, ``X`` for
# an unknown residue, and the IUPAC ambiguity / rare codes that AlphaFold's featuriser
# maps to ``X`` (B, Z, J) or to their closest standard residue (U, O).
STANDARD_RESIDUES = "ACDEFGHIKLMNPQRSTVWY"
ACCEPTED_RESIDUES = frozenset(STANDARD_RESIDUES + "XBZJUO")
# Characters allowed in an aligned MSA row once a3m insertions (lower case) are removed.
ACCEPTED_MSA_CHARACTERS = frozenset(STANDARD_RESIDUES + "XBZJUO-")
MSA_EXTENSIONS = (".a3m", ".sto")


@dataclasses.dataclass(frozen=True)
class Problem:
    """One reason an input cannot be folded."""

    file: str
    message: str
    record: Optional[str] = None  # record id, when the problem belongs to one record
    index: Optional[int] = None  # 1-based index of the record in its file
    position: Optional[int] = None  # 1-based residue position, when there is one

    def __str__(self) -> str:
        where = self.file
        if self.record is not None:
            where += f": record {self.record!r}"
            if self.index is not None:
                where += f" (#{self.index})"
        return f"{where}: {self.message}"

    def to_json(self) -> dict:
        """The problem as a JSON-ready dict (also carries the formatted message)."""
        out = dataclasses.asdict(self)
        out["text"] = str(self)
        return out


@dataclasses.dataclass
class Alignment:
    """An MSA matched to a record: rows aligned to the query, and deletion counts."""

    paths: List[str]
    rows: List[str]
    deletions: List[List[int]]

    @property
    def depth(self) -> int:
        """Number of rows, query included."""
        return len(self.rows)


@dataclasses.dataclass
class Record:
    """A FASTA record that passed validation."""

    id: str
    description: str
    sequence: str
    source: str  # the FASTA file it came from
    index: int  # 1-based index within that file
    order: int = 0  # 0-based index over all valid records of the run
    alignment: Optional[Alignment] = None

    @property
    def length(self) -> int:
        """Number of residues."""
        return len(self.sequence)


def _read_fasta(path: str) -> Tuple[list, Optional[Problem]]:
    """All records of ``path`` (Biopython), or a problem saying why it cannot be read."""
    if not os.path.exists(path):
        return [], Problem(path, "file does not exist")
    if os.path.isdir(path):
        return [], Problem(path, "is a directory, not a FASTA file")
    try:
        with open(path, "r", encoding="utf-8") as handle:
            records = list(SeqIO.parse(handle, "fasta"))
    except UnicodeDecodeError as err:
        return [], Problem(path, f"unreadable: not a text FASTA file ({err.reason} at byte {err.start})")
    except OSError as err:
        return [], Problem(path, f"unreadable: {err.strerror or err}")
    except ValueError as err:
        first_line = str(err).strip().splitlines()[0]
        return [], Problem(path, f"not a FASTA file: {first_line}")
    if not records:
        return [], Problem(path, "contains no FASTA records (no line starts with '>')")
    return records, None


def _description(seq_record) -> str:
    """The FASTA header without its leading id."""
    text = seq_record.description
    if text.startswith(seq_record.id):
        text = text[len(seq_record.id):]
    return text.strip()


def _sequence_problem(
    path: str, record_id: str, index: int, sequence: str
) -> Optional[Problem]:
    if not sequence:
        return Problem(path, "empty record (no residues)", record_id, index)
    for pos, letter in enumerate(sequence.upper(), start=1):
        if letter not in ACCEPTED_RESIDUES:
            return Problem(
                path,
                f"invalid residue {letter!r} at position {pos} "
                f"(accepted: {STANDARD_RESIDUES} and X, B, Z, J, U, O)",
                record_id,
                index,
                pos,
            )
    return None


def alignment_paths(alignment_dir: Optional[str], record_id: str) -> List[str]:
    """MSA files for ``record_id``: ``<dir>/<id>.a3m|.sto`` and ``<dir>/<id>/*.a3m|*.sto``.

    ``<id>`` is the record id as written, else its :func:`safe_name`.
    """
    if not alignment_dir:
        return []
    names = [n for n in dict.fromkeys([record_id, safe_name(record_id)]) if os.sep not in n]
    for name in names:
        found = [
            os.path.join(alignment_dir, name + ext)
            for ext in MSA_EXTENSIONS
            if os.path.isfile(os.path.join(alignment_dir, name + ext))
        ]
        folder = os.path.join(alignment_dir, name)
        if os.path.isdir(folder):
            found += [
                os.path.join(folder, f)
                for f in sorted(os.listdir(folder))
                if f.endswith(MSA_EXTENSIONS)
            ]
        if found:
            return found
    return []


def _parse_msa(path: str) -> Tuple[List[str], List[List[int]]]:
    from openfold.data import parsers

    with open(path, "r", encoding="utf-8") as handle:
        text = handle.read()
    if path.endswith(".sto"):
        rows, deletions, _ = parsers.parse_stockholm(text)
    else:
        rows, deletions = parsers.parse_a3m(text)
    return list(rows), [list(d) for d in deletions]


def _load_alignment(
    paths: Sequence[str], fasta: str, record_id: str, index: int, sequence: str
) -> Tuple[Optional[Alignment], Optional[Problem]]:
    rows: List[str] = []
    deletions: List[List[int]] = []

    def problem(msa_path: str, message: str, position: Optional[int] = None) -> Problem:
        return Problem(fasta, f"MSA {msa_path}: {message}", record_id, index, position)

    for path in paths:
        try:
            msa_rows, msa_deletions = _parse_msa(path)
        except UnicodeDecodeError as err:
            return None, problem(path, f"unreadable: not a text file ({err.reason})")
        except OSError as err:
            return None, problem(path, f"unreadable: {err.strerror or err}")
        except ValueError as err:
            return None, problem(path, f"cannot be parsed: {err}")
        if not msa_rows:
            return None, problem(path, "contains no sequences")
        query = msa_rows[0]
        if query != sequence:
            if len(query) != len(sequence):
                return None, problem(
                    path,
                    f"query (first row) has {len(query)} residues, the record has "
                    f"{len(sequence)}",
                )
            pos = next(i for i, (a, b) in enumerate(zip(query, sequence), 1) if a != b)
            return None, problem(
                path,
                f"query (first row) does not match the record: {query[pos - 1]!r} "
                f"instead of {sequence[pos - 1]!r} at position {pos}",
                pos,
            )
        for row_no, row in enumerate(msa_rows, start=1):
            if len(row) != len(sequence):
                return None, problem(
                    path,
                    f"row {row_no} has {len(row)} aligned columns, expected {len(sequence)}",
                )
            for pos, char in enumerate(row, start=1):
                if char not in ACCEPTED_MSA_CHARACTERS:
                    return None, problem(
                        path, f"row {row_no}: invalid character {char!r} at position {pos}", pos
                    )
        rows.extend(msa_rows)
        deletions.extend(msa_deletions)
    return Alignment(list(paths), rows, deletions), None


def load_inputs(
    fasta_paths: Iterable[str], alignment_dir: Optional[str] = None
) -> Tuple[List[Record], List[Problem]]:
    """Read and validate every record of every FASTA file.

    Returns the valid records (numbered in input order) and the problems: unreadable
    files, empty records, invalid residue letters, duplicate ids (the first occurrence
    stays valid), and MSAs that cannot be read or whose query is not the record.
    """
    records: List[Record] = []
    problems: List[Problem] = []
    seen: dict = {}
    folders: dict = {}
    if alignment_dir and not os.path.isdir(alignment_dir):
        problems.append(Problem(alignment_dir, "alignment directory does not exist"))
        alignment_dir = None
    for path in fasta_paths:
        parsed, problem = _read_fasta(path)
        if problem is not None:
            problems.append(problem)
            continue
        for index, seq_record in enumerate(parsed, start=1):
            record_id = seq_record.id
            if not record_id:
                problems.append(Problem(path, "record has no id (empty '>' line)", None, index))
                continue
            if record_id in seen:
                first_path, first_index = seen[record_id]
                problems.append(
                    Problem(
                        path,
                        f"duplicate id: already used by record #{first_index} of {first_path}",
                        record_id,
                        index,
                    )
                )
                continue
            seen[record_id] = (path, index)
            folder = safe_name(record_id)
            if folder in folders:
                problems.append(
                    Problem(
                        path,
                        f"id maps to output folder {folder!r}, already used by record "
                        f"{folders[folder]!r}",
                        record_id,
                        index,
                    )
                )
                continue
            folders[folder] = record_id
            sequence = str(seq_record.seq)
            bad = _sequence_problem(path, record_id, index, sequence)
            if bad is not None:
                problems.append(bad)
                continue
            sequence = sequence.upper()
            alignment = None
            msa_paths = alignment_paths(alignment_dir, record_id)
            if msa_paths:
                alignment, bad = _load_alignment(msa_paths, path, record_id, index, sequence)
                if bad is not None:
                    problems.append(bad)
                    continue
            records.append(
                Record(
                    id=record_id,
                    description=_description(seq_record),
                    sequence=sequence,
                    source=path,
                    index=index,
                    alignment=alignment,
                )
            )
    for order, record in enumerate(records):
        record.order = order
    return records, problems


def safe_name(record_id: str) -> str:
    """A file-system-safe folder name for ``record_id`` (``sp|P1|X`` -> ``sp_P1_X``)."""
    keep = "".join(c if (c.isalnum() or c in "-_.") else "_" for c in record_id)
    keep = keep.lstrip(".")
    return keep or "record"
