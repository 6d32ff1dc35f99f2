"""Reading and validating folding inputs: FASTA records and their optional MSAs.

Everything is checked before any model is built, so that a typo in record 900 does not
surface after hours of folding. Each problem names the file, the record and, where it
applies, the 1-based residue position or line::

    inputs/batch.fasta: record 'p3' (#3): invalid residue '*' at position 41

:func:`load_inputs` returns the valid records and the problems found; the caller decides
whether problems are fatal (the default) or listed and skipped (``--skip-invalid``).

Files are read as UTF-8; a UTF-8 byte-order mark is ignored, UTF-16/32 text is a
problem. Record ids become file names only through :func:`safe_name`: ASCII letters,
digits, ``-``, ``_`` and ``.``, never hidden, ``.`` or ``..``, at most 100 characters.
Two ids with the same safe name (ignoring case) are a problem naming both records.

Rare and ambiguous residue codes are folded as a standard residue
(:data:`RESIDUE_SUBSTITUTIONS`), in the query and in its MSA alike, and the written
structure shows that residue. ``X`` (unknown) is folded as OpenFold's unknown residue,
which has no atoms: it is missing from the PDB / mmCIF files.
"""
from __future__ import annotations

import codecs
import dataclasses
import hashlib
import io
import os
import string
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from Bio import SeqIO

# One-letter codes accepted in a query sequence: the 20 standard amino acids, ``X`` for
# an unknown residue, and the rare / ambiguous codes of RESIDUE_SUBSTITUTIONS.
STANDARD_RESIDUES = "ACDEFGHIKLMNPQRSTVWY"
# Folded (and written) as: selenocysteine as cysteine, pyrrolysine as lysine, Asx (D or
# N) as aspartate and Glx (E or Q) as glutamate (as HHblits reads MSAs), Xle (L or I) as
# leucine.
RESIDUE_SUBSTITUTIONS = {"U": "C", "O": "K", "B": "D", "Z": "E", "J": "L"}
ACCEPTED_RESIDUES = frozenset(STANDARD_RESIDUES + "X" + "".join(RESIDUE_SUBSTITUTIONS))
# Characters allowed in an aligned MSA row once a3m insertions (lower case) are removed.
ACCEPTED_MSA_CHARACTERS = frozenset(ACCEPTED_RESIDUES | {"-"})
MSA_EXTENSIONS = (".a3m", ".sto")
# Files of a directory given as an input: FASTA files, and A3M files (query + MSA).
INPUT_EXTENSIONS = (".fasta", ".fa", ".faa", ".a3m")
# OpenFold's feature pipeline fails on a single residue.
MIN_LENGTH = 2
MAX_NAME_LENGTH = 100
# Names in the output folder that belong to the run, not to a record.
RESERVED_NAMES = frozenset({"summary.json", "flashlight-fold.log"})
_SAFE_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-_.")
_SUBSTITUTE = str.maketrans(RESIDUE_SUBSTITUTIONS)


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
        return f"{where}: {' '.join(self.message.splitlines())}"  # always one line

    def to_json(self) -> dict:
        """The problem as a JSON-ready dict (also carries the formatted message)."""
        out = dataclasses.asdict(self)
        out["text"] = str(self)
        return out


@dataclasses.dataclass
class Alignment:
    """An MSA matched to a record: rows aligned to the query, and deletion counts."""

    paths: List[str]
    rows: List[str]  # residue codes already substituted, as the model reads them
    deletions: List[List[int]]

    @property
    def depth(self) -> int:
        """Number of rows, query included."""
        return len(self.rows)


def folded_sequence(sequence: str) -> str:
    """``sequence`` (upper case) with the codes of :data:`RESIDUE_SUBSTITUTIONS` replaced."""
    return sequence.upper().translate(_SUBSTITUTE)


def _listed(items: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


@dataclasses.dataclass
class Record:
    """A FASTA record that passed validation.

    ``sequence`` is what is folded and written (substitutions applied);
    ``input_sequence`` is the sequence as read (upper case).
    """

    id: str
    description: str
    sequence: str
    source: str  # the FASTA file it came from
    index: int  # 1-based index within that file
    order: int = 0  # 0-based index over all valid records of the run
    alignment: Optional[Alignment] = None
    input_sequence: Optional[str] = None

    def __post_init__(self):
        if self.input_sequence is None:
            self.input_sequence = self.sequence.upper()
        self.sequence = folded_sequence(self.sequence)

    @property
    def length(self) -> int:
        """Number of residues."""
        return len(self.sequence)

    @property
    def substitutions(self) -> List[Tuple[int, str, str]]:
        """``(position, code as read, residue folded)`` for every substituted residue."""
        pairs = zip(self.input_sequence, self.sequence)
        return [(i, a, b) for i, (a, b) in enumerate(pairs, start=1) if a != b]

    @property
    def unknown_positions(self) -> List[int]:
        """1-based positions of ``X`` residues (folded, but without atoms)."""
        return [i for i, c in enumerate(self.sequence, start=1) if c == "X"]

    def residue_note(self) -> Optional[str]:
        """A one-line note on substituted and unknown residues, or None when there are none."""
        parts = []
        if self.substitutions:
            changes = [f"{a}{i}->{b}" for i, a, b in self.substitutions]
            parts.append(f"folded as standard residues: {_listed(changes)}")
        if self.unknown_positions:
            where = _listed([str(i) for i in self.unknown_positions])
            parts.append(f"unknown residue X at position(s) {where} has no atoms in the structure")
        return "; ".join(parts) or None


def safe_name(record_id: str) -> str:
    """The file and folder name for ``record_id`` (``sp|P1|X`` -> ``sp_P1_X``).

    ASCII letters, digits, ``-``, ``_`` and ``.`` are kept, anything else becomes ``_``;
    leading dots are dropped. An id with nothing left gets ``record-<hash>``, a longer
    one its first 91 characters and ``-<hash>``; names of the run's own files
    (``summary.json``) get a trailing ``_``. The hash ignores case, like the collision
    check of :func:`load_inputs`.
    """
    name = "".join(c if c in _SAFE_CHARACTERS else "_" for c in record_id).lstrip(".")
    digest = hashlib.sha1(record_id.lower().encode("utf-8", "surrogatepass")).hexdigest()[:8]
    if not name:
        return f"record-{digest}"
    if len(name) > MAX_NAME_LENGTH:
        return name[: MAX_NAME_LENGTH - 9] + "-" + digest
    if name.lower() in RESERVED_NAMES:
        return name + "_"
    return name


def _plain_entry_name(name: str) -> bool:
    """True when ``name`` can only name an entry of the folder it is joined to."""
    return (
        bool(name)
        and not name.startswith(".")  # neither '.', '..' nor hidden
        and not any(sep and sep in name for sep in ("/", "\0", os.sep, os.altsep))
        and len(name.encode("utf-8", "surrogatepass")) <= 200
    )


# -- text files ---------------------------------------------------------------------

_WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def _read_text(path: str, kind: str) -> Tuple[Optional[str], Optional[str]]:
    """The UTF-8 text of ``path`` (without a byte-order mark), or why it cannot be read."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        return None, f"unreadable: {err.strerror or err}"
    for bom, encoding in _WIDE_BOMS:
        if data.startswith(bom):
            return None, (
                f"unreadable: not a text {kind} in UTF-8 but {encoding} (byte-order mark "
                "at byte 0); save it as UTF-8"
            )
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"unreadable: not a text {kind} ({err.reason} at byte {err.start})"
    if "\0" in text:
        return None, f"unreadable: not a text {kind} (NUL byte at byte {data.index(0)})"
    return text, None


def _clip(line: str, width: int = 30) -> str:
    line = line.strip()
    return line if len(line) <= width else line[:width] + "..."


def _read_fasta(path: str) -> Tuple[list, Optional[Problem]]:
    """All records of ``path`` (Biopython), or a problem saying why it cannot be read."""
    if not os.path.exists(path):
        return [], Problem(path, "file does not exist")
    if os.path.isdir(path):
        return [], Problem(path, "is a directory, not a FASTA file")
    text, error = _read_text(path, "FASTA file")
    if error:
        return [], Problem(path, error)
    lines = text.splitlines()
    first = next((n for n, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return [], Problem(path, "contains no FASTA records (no line starts with '>')")
    if not lines[first].lstrip().startswith(">"):
        return [], Problem(
            path,
            f"not a FASTA file: line {first + 1} ({_clip(lines[first])!r}) comes before the "
            "first '>' header line",
        )
    body = "\n".join([lines[first].lstrip()] + lines[first + 1:]) + "\n"
    try:
        records = list(SeqIO.parse(io.StringIO(body), "fasta"))
    except ValueError as err:  # Biopython's messages span lines: keep them on one
        return [], Problem(path, "not a FASTA file: " + " ".join(str(err).split()))
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
    if len(sequence) < MIN_LENGTH:
        return Problem(
            path,
            f"too short: {len(sequence)} residue; records of at least {MIN_LENGTH} residues "
            "can be folded",
            record_id,
            index,
        )
    return None


# -- alignments ---------------------------------------------------------------------


def alignment_paths(alignment_dir: Optional[str], record_id: str) -> List[str]:
    """MSA files for ``record_id``: ``<dir>/<id>.a3m|.sto`` and ``<dir>/<id>/*.a3m|*.sto``.

    ``<id>`` is the record id as written when it is a plain file name (no path
    separator, not hidden, ``.`` or ``..``), else its :func:`safe_name`; so a record
    only ever reads files inside ``alignment_dir`` named after it.
    """
    if not alignment_dir:
        return []
    names = [n for n in dict.fromkeys([record_id, safe_name(record_id)]) if _plain_entry_name(n)]
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
                if f.endswith(MSA_EXTENSIONS) and not f.startswith(".")
                and os.path.isfile(os.path.join(folder, f))
            ]
        if found:
            return found
    return []


class _MsaError(ValueError):
    """An MSA file that cannot be read; the message is complete and one line."""


def _check_a3m(text: str) -> None:
    """Raise :class:`_MsaError` unless every sequence line follows a '>' header."""
    header_seen = False
    for line_no, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(">"):
            header_seen = True
        elif not header_seen:
            raise _MsaError(
                f"line {line_no} ({_clip(line)!r}) comes before the first '>' header line "
                "(an A3M file starts with the query's header)"
            )


def _check_stockholm(text: str) -> None:
    """Raise :class:`_MsaError` unless rows are ``name sequence`` lines of one width."""
    widths: Dict[str, int] = {}
    first_line: Dict[str, int] = {}
    for line_no, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith(("#", "//")):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise _MsaError(
                f"line {line_no} ({_clip(line)!r}) has {len(fields)} field(s), expected "
                "'<name> <aligned sequence>'"
            )
        first_line.setdefault(fields[0], line_no)
        widths[fields[0]] = widths.get(fields[0], 0) + len(fields[1])
    if not widths:
        return
    query, query_width = next(iter(widths.items()))
    for name, width in widths.items():
        if width != query_width:
            raise _MsaError(
                f"sequence {name!r} (line {first_line[name]}) has {width} columns, the query "
                f"{query!r} has {query_width}"
            )


def _parse_msa(path: str) -> Tuple[List[str], List[List[int]]]:
    """Rows and deletion counts of an ``.a3m`` / ``.sto`` file (OpenFold's parsers)."""
    from openfold.data import parsers

    text, error = _read_text(path, "file")
    if error:
        raise _MsaError(error)
    stockholm = path.endswith(".sto")
    (_check_stockholm if stockholm else _check_a3m)(text)
    try:
        if stockholm:
            rows, deletions, _ = parsers.parse_stockholm(text)
        else:
            rows, deletions = parsers.parse_a3m(text)
    except (ValueError, IndexError, KeyError) as err:
        raise _MsaError(f"cannot be parsed ({type(err).__name__}: {err})") from err
    return list(rows), [list(d) for d in deletions]


def _msa_problem(msa_rows: List[str], record: Record) -> Optional[Tuple[str, Optional[int]]]:
    """Why ``msa_rows`` (as read) do not align to ``record``: (message, position), or None."""
    if not msa_rows:
        return "contains no sequences", None
    query = msa_rows[0]
    if len(query) != record.length:
        return f"query (first row) has {len(query)} residues, the record has {record.length}", None
    if folded_sequence(query) != record.sequence:
        pos = next(
            i for i, (a, b) in enumerate(zip(folded_sequence(query), record.sequence), 1) if a != b
        )
        return (
            f"query (first row) does not match the record: {query[pos - 1]!r} instead of "
            f"{record.input_sequence[pos - 1]!r} at position {pos}",
            pos,
        )
    for row_no, row in enumerate(msa_rows, start=1):
        if len(row) != record.length:
            return f"row {row_no} has {len(row)} aligned columns, expected {record.length}", None
        for pos, char in enumerate(row, start=1):
            if char not in ACCEPTED_MSA_CHARACTERS:
                return f"row {row_no}: invalid character {char!r} at position {pos}", pos
    return None


def _load_alignment(paths: Sequence[str], record: Record) -> Optional[Problem]:
    """Attach the MSA of ``paths`` to ``record``, or return why it cannot be used."""
    rows: List[str] = []
    deletions: List[List[int]] = []
    for path in paths:

        def problem(message: str, position: Optional[int] = None) -> Problem:
            return Problem(
                record.source, f"MSA {path}: {message}", record.id, record.index, position
            )

        try:
            msa_rows, msa_deletions = _parse_msa(path)
        except _MsaError as err:
            return problem(str(err))
        bad = _msa_problem(msa_rows, record)
        if bad is not None:
            return problem(*bad)
        rows.extend(folded_sequence(row) for row in msa_rows)
        deletions.extend(msa_deletions)
    record.alignment = Alignment(list(paths), rows, deletions)
    return None


# -- everything ---------------------------------------------------------------------


def expand_inputs(paths: Iterable[str], problems: List[Problem]) -> List[str]:
    """``paths`` with each directory replaced by its input files, sorted by name.

    A directory contributes its ``*.fasta``, ``*.fa``, ``*.faa`` and ``*.a3m`` files
    (not hidden, not in subfolders); one without any is a problem.
    """
    files: List[str] = []
    for path in paths:
        path = os.fspath(path)
        if not os.path.isdir(path):
            files.append(path)
            continue
        found = sorted(
            os.path.join(path, name) for name in os.listdir(path)
            if name.lower().endswith(INPUT_EXTENSIONS) and not name.startswith(".")
            and os.path.isfile(os.path.join(path, name))
        )
        if not found:
            problems.append(Problem(path, "directory holds no input files (*.fasta, *.fa, *.faa, *.a3m)"))
        files.extend(found)
    return files



def load_inputs(
    fasta_paths: Iterable[str], alignment_dir: Optional[str] = None
) -> Tuple[List[Record], List[Problem]]:
    """Read and validate every record of every FASTA file.

    ``fasta_paths`` may name directories (:func:`expand_inputs`) and A3M files: an A3M
    file is one record, its first sequence, with the whole file as its MSA.

    Returns the valid records (numbered in input order) and the problems: unreadable
    files, empty or too short records, invalid residue letters, duplicate ids, ids whose
    file names collide (the first occurrence stays valid), and MSAs that cannot be read
    or whose query is not the record.
    """
    records: List[Record] = []
    problems: List[Problem] = []
    seen: dict = {}
    names: dict = {}  # safe name, lower case -> (id, file, index)
    if alignment_dir and not os.path.isdir(alignment_dir):
        what = "is not a directory" if os.path.exists(alignment_dir) else "does not exist"
        problems.append(Problem(alignment_dir, f"alignment directory {what}"))
        alignment_dir = None
    for path in expand_inputs(fasta_paths, problems):
        parsed, problem = _read_fasta(path)
        if problem is not None:
            problems.append(problem)
            continue
        is_a3m = path.lower().endswith(".a3m")
        if is_a3m:  # the query is the first record; the file is its MSA
            parsed = parsed[:1]
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
            name = safe_name(record_id)
            if name.lower() in names:
                other, other_path, other_index = names[name.lower()]
                problems.append(
                    Problem(
                        path,
                        f"id maps to output folder {name!r}, as does record {other!r} "
                        f"(#{other_index} of {other_path}); ids must differ once unsafe "
                        "characters are replaced by '_' and case is ignored",
                        record_id,
                        index,
                    )
                )
                continue
            names[name.lower()] = (record_id, path, index)
            sequence = str(seq_record.seq)
            bad = _sequence_problem(path, record_id, index, sequence)
            if bad is not None:
                problems.append(bad)
                continue
            record = Record(
                id=record_id,
                description=_description(seq_record),
                sequence=sequence,
                source=path,
                index=index,
            )
            msa_paths = [path] if is_a3m else alignment_paths(alignment_dir, record_id)
            if msa_paths:
                bad = _load_alignment(msa_paths, record)
                if bad is not None:
                    problems.append(bad)
                    continue
            records.append(record)
    for order, record in enumerate(records):
        record.order = order
    return records, problems
