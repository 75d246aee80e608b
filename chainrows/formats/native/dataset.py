"""Reading a SPEC §2 dataset: find the files, check types, normalize, check nulls.

Every table comes out in the canonical schema of :mod:`chainrows.formats.native.schema` (string, list,
int64, uint64 chain_hash, ...), with the optional columns (ledger.integrity_error,
tokens.logprobs, rollouts.accepted_response_ids) present iff the input has them. The single exception: a
column chunk that does not fit 32-bit offsets keeps its 64-bit-offset form (``large_string``,
``large_list<…>`` with ``large_string`` items), for the whole column of the returned table
(or for that batch, in :func:`iter_table_batches`). Consumers must accept both forms.

Null ``item_keys``/``output_keys``/``tokens`` lists come out as empty lists (SPEC §2); null
``item_ids``/``output_ids``/``logprobs``/``accepted_response_ids`` lists stay null. Nulls in
non-nullable columns, and null entries inside key, token and logprob lists, are InputErrors
naming the first offending row (0-based, within its file). Columns are chunked arrays.

Unusable input raises :class:`~chainrows.errors.InputError` with a one-line message.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from chainrows.arrays import offsets_rise_within, offsets_view
from chainrows.errors import InputError
from chainrows.formats.native.footers import FileFacts, file_facts
from chainrows.formats.native.footers import one_line as _one_line
from chainrows.formats.native.footers import reading as _reading
from chainrows.formats.native.schema import (
    ACCEPTED_FIELD,
    INTEGRITY_FIELD,
    LEDGER_SCHEMA,
    LOGPROBS_FIELD,
    ROLLOUTS_SCHEMA,
    TOKENS_SCHEMA,
)
from chainrows.formats.native.small_files import file_groups, read_group

TABLES = ("ledger", "tokens", "rollouts")
DEFAULT_BATCH_ROWS = 65_536

# Per table: the canonical schema, the optional columns, the columns that may hold nulls, the
# list columns whose *entries* may hold nulls (docs/decisions.md "Input").
CANONICAL = {
    "ledger": LEDGER_SCHEMA.append(INTEGRITY_FIELD),
    "tokens": TOKENS_SCHEMA.append(LOGPROBS_FIELD),
    "rollouts": ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD),
}
OPTIONAL = {"ledger": ("integrity_error",), "tokens": ("logprobs",), "rollouts": ("accepted_response_ids",)}
NULLABLE = {
    "ledger": {"parent_id", "item_keys", "item_ids", "integrity_error"},
    "tokens": {"tokens", "logprobs"},
    "rollouts": {"group_id", "reward", "output_keys", "output_ids", "terminal_response_id",
                 "accepted_response_ids"},
}
NULL_ENTRIES_OK = {"item_ids", "output_ids", "accepted_response_ids"}
# SPEC §2: a null value of these list columns reads as an empty list; the reader replaces it
# by one, so their offsets can be used as is. (A null item_ids/output_ids/logprobs/
# accepted_response_ids list keeps its own meaning and stays null.)
NULL_LIST_IS_EMPTY = {"item_keys", "output_keys", "tokens"}
# An optional column present in some files of a table and absent in others: these are filled
# with nulls (a null list means "no record", a null integrity_error "fine"); any other
# optional column is an InputError.
FILL_IF_MISSING = {"accepted_response_ids", "integrity_error"}

_MAX_INT64 = (1 << 63) - 1


# ----------------------------------------------------------------------------- file listing

def table_files(dataset_dir: str | os.PathLike, name: str) -> list[Path]:
    """The Parquet files of table ``name``: ``[<name>.parquet]``, or the files of the directory
    ``<name>/`` in lexicographic (code point) order of their names, skipping names that start
    with ``.`` or ``_``. ``<name>.parquet`` may itself be such a directory (Spark style).

    An empty directory gives ``[]`` (a table with zero rows). Raises InputError when the
    dataset directory or the table is missing, when both forms exist, or when a table
    directory holds a (non-hidden) subdirectory.
    """
    root = Path(dataset_dir)
    if not root.is_dir():
        raise InputError(f"dataset directory {str(root)!r} does not exist or is not a directory")
    single, folder = root / f"{name}.parquet", root / name
    if single.exists() and folder.exists():
        raise InputError(f"table stored twice: both {single.name} and {folder.name}/ exist; "
                         f"keep one", table=name, directory=root)
    if single.is_file():
        return [single]
    if single.is_dir():
        folder = single
    elif not folder.is_dir():
        hint = " (a file, expected a directory)" if folder.exists() else ""
        raise InputError(f"table not found: expected {single.name} or a directory {name}/"
                         f"{hint}", table=name, directory=root)
    return _list_parts(folder, name)


def _list_parts(folder: Path, name: str) -> list[Path]:
    files = []
    for entry in sorted(os.listdir(folder)):
        if entry.startswith((".", "_")):
            continue
        path = folder / entry
        if path.is_dir():
            raise InputError(f"unexpected subdirectory {entry!r} in the table directory "
                             f"(nested or partitioned layouts are not supported)",
                             table=name, directory=folder)
        if not path.is_file():  # a FIFO would block the reader forever; a dangling link fails later anyway
            raise InputError(f"{entry!r} in the table directory is not a regular file",
                             table=name, directory=folder)
        files.append(path)
    return files


# ----------------------------------------------------------------------------- type rules

def _is_stringish(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _accepts(found: pa.DataType, want: pa.DataType) -> bool:
    """SPEC §2 rule: does a column of physical type ``found`` satisfy canonical type ``want``?"""
    if pa.types.is_null(found):  # an all-null column; the null check decides
        return True
    if pa.types.is_string(want):
        if pa.types.is_dictionary(found):
            return _is_stringish(found.value_type)
        return _is_stringish(found)
    if want == pa.int64():
        return pa.types.is_integer(found)
    if pa.types.is_list(want):
        if not (pa.types.is_list(found) or pa.types.is_large_list(found)):
            return False
        item = found.value_type
        if pa.types.is_string(want.value_type):
            return _is_stringish(item)
        return item == want.value_type
    return found == want  # uint64 chain_hash, float64 reward, bool failed: exact


def _expected(want: pa.DataType) -> str:
    if pa.types.is_string(want):
        return "string (or large_string)"
    if want == pa.int64():
        return "an integer type"
    if pa.types.is_list(want):
        return f"list<{want.value_type}> (or large_list)"
    return str(want)


def _type_name(t: pa.DataType) -> str:
    """Arrow type name without the list field name (it varies: item, element)."""
    kinds = (("list", pa.types.is_list), ("large_list", pa.types.is_large_list),
             ("list_view", pa.types.is_list_view), ("large_list_view", pa.types.is_large_list_view))
    for kind, test in kinds:
        if test(t):
            return f"{kind}<{_type_name(t.value_type)}>"
    if pa.types.is_fixed_size_list(t):
        return f"fixed_size_list<{_type_name(t.value_type)}>[{t.list_size}]"
    return str(t)


def validate_schema(name: str, schema: pa.Schema, file: str | os.PathLike | None = None,
                 columns: Sequence[str] | None = None) -> list[str]:
    """Check one file's Arrow schema against the SPEC §2 rules for table ``name``.

    Extra columns are ignored. ``columns`` limits the check to those canonical columns (None:
    all). Returns the wanted columns present in the file, in canonical order (optional ones
    only when present). Raises InputError naming table, column, found/expected type and file.
    """
    wanted = _wanted(name, columns)
    for col in wanted:
        want = CANONICAL[name].field(col).type
        hits = schema.get_all_field_indices(col)
        if not hits:
            if col in OPTIONAL[name]:
                continue
            raise InputError(f"missing column {col!r}", table=name, file=file, column=col)
        if len(hits) > 1:
            raise InputError(f"column {col!r} appears {len(hits)} times", table=name,
                             file=file, column=col)
        found = schema.field(hits[0]).type
        if not _accepts(found, want):
            raise InputError(f"column {col!r} has type {_type_name(found)}, expected "
                             f"{_expected(want)}", table=name, file=file, column=col)
    return [c for c in wanted if schema.get_field_index(c) >= 0]


def _wanted(name: str, columns: Sequence[str] | None) -> list[str]:
    if name not in CANONICAL:
        raise ValueError(f"unknown table {name!r}; expected one of {TABLES}")
    names = CANONICAL[name].names
    if columns is None:
        return list(names)
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise ValueError(f"unknown {name} column(s) {unknown}; expected some of {names}")
    return [c for c in names if c in set(columns)]


# ----------------------------------------------------------------------------- planning

@dataclass(frozen=True)
class TablePlan:
    """The checked files of one table and the columns a read will return."""

    name: str
    files: list[Path]
    columns: list[str]                      # output columns, canonical order
    present: list[list[str]] = field(default_factory=list)  # per file: the canonical columns it has
    facts: list[FileFacts] = field(default_factory=list)  # per file: its footer's facts

    @property
    def schema(self) -> pa.Schema:
        """Canonical output schema (large-offset fallbacks aside)."""
        return pa.schema([CANONICAL[self.name].field(c) for c in self.columns])

    def read_columns(self, i: int) -> list[str]:
        """The columns read from file ``i``: the output columns it has."""
        return [c for c in self.present[i] if c in self.columns]

    def read_stored(self, i: int) -> int:
        """Uncompressed bytes of the columns read from file ``i`` (its footer), whatever other
        columns the file carries."""
        return self.facts[i].stored_of(self.read_columns(i))

    def read_decoded(self, i: int) -> int:
        """Estimated Arrow bytes of the columns read from file ``i`` once decoded (its footer):
        what reading it holds in memory (``FileFacts.decoded_of``)."""
        return self.facts[i].decoded_of(self.read_columns(i))


def plan_table(dataset_dir: str | os.PathLike, name: str,
               columns: Sequence[str] | None = None) -> TablePlan:
    """List the table's files and check every file's schema (footers only, no data read)."""
    files = table_files(dataset_dir, name)
    facts = [file_facts(name, f) for f in files]
    present, last = [], None  # last: (schema, its present columns), for runs of one schema
    for f, fa in zip(files, facts):
        if last is None or not fa.schema.equals(last[0]):  # metadata aside: validate_schema ignores it
            last = (fa.schema, validate_schema(name, fa.schema, f, columns))
        present.append(last[1])
    wanted = _wanted(name, columns)
    out = [c for c in wanted if c not in OPTIONAL[name] or any(c in p for p in present)]
    for col in out:
        if col in OPTIONAL[name] and col not in FILL_IF_MISSING:
            for f, p in zip(files, present):
                if col not in p:
                    raise InputError(f"optional column {col!r} is present in some files of the "
                                     f"table but missing in this one", table=name, file=f,
                                     column=col)
    return TablePlan(name, files, out, present, facts)


# ----------------------------------------------------------------------------- normalizing

def _large_form(t: pa.DataType) -> pa.DataType:
    """The 64-bit-offset counterpart of a canonical type (identity for fixed-width types)."""
    if pa.types.is_string(t):
        return pa.large_string()
    if pa.types.is_list(t):
        return pa.large_list(_large_form(t.value_type))
    return t


def _narrow_cast(col: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    """Cast ``col`` to ``target`` (safe). Isolated so tests can simulate offset overflow."""
    return col.cast(target)


def _normalize_column(name: str, file: Path, col_name: str, col: pa.ChunkedArray,
                      row0: int) -> pa.ChunkedArray:
    target = CANONICAL[name].field(col_name).type
    _validate_column(name, file, col_name, col, full=False)
    col = _buffered_empty_chunks(col)
    if col.type == target and str(col.type) == str(target):  # == ignores list field names
        return col
    if target == pa.int64() and col.type == pa.uint64():
        _check_int64_range(name, file, col_name, col, row0)
    if _cast_follows_pointers(col.type):
        _validate_column(name, file, col_name, col, full=True)
    try:
        return _narrow_cast(col, target)
    except (pa.ArrowInvalid, pa.ArrowCapacityError) as exc:
        large = _large_form(target)
        if large == target:  # not an offsets problem
            raise InputError(f"column {col_name!r} cannot be converted to {target}: "
                             f"{_one_line(exc)}", table=name, file=file, column=col_name) from exc
        return col.cast(large)  # too big for 32-bit offsets: keep 64-bit offsets


def _buffered_empty_chunks(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """``col`` with each zero-length chunk that has no offsets buffer rebuilt with one. Arrow
    accepts such a chunk as valid (a hand-built table may hold one), and some of its compute
    kernels crash the process on it (``list_flatten`` of a list column)."""
    def unbuffered(chunk):
        return len(chunk) == 0 and len(chunk.buffers()) > 1 and chunk.buffers()[1] is None

    if not any(unbuffered(c) for c in col.chunks):
        return col
    return pa.chunked_array([pa.array([], c.type) if unbuffered(c) else c for c in col.chunks], col.type)


def _cast_follows_pointers(t: pa.DataType) -> bool:
    """A dictionary or view type (or lists of them): casting it to the canonical type reads
    the strings through its indices, views or offsets, before any later check has run."""
    views = ("is_string_view", "is_binary_view", "is_list_view", "is_large_list_view")
    if pa.types.is_dictionary(t) or any(getattr(pa.types, v, lambda _: False)(t) for v in views):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _cast_follows_pointers(t.value_type)
    return False


def _validate_column(name, file, col_name, col: pa.ChunkedArray, full: bool) -> None:
    """Arrow's validation of every chunk, quick (buffer sizes, end offsets: before anything
    uses the column, so a hand-built array too short for its length gets an InputError, not
    Arrow's error from a later step) or full (a cast that follows pointers; hand-built arrays
    can point outside their buffers, arrays read from Parquet pass)."""
    for chunk in col.chunks:
        try:
            chunk.validate(full=full)
        except (pa.ArrowInvalid, pa.ArrowIndexError) as exc:
            raise InputError(f"column {col_name!r} is not a valid Arrow array: {_one_line(exc)}", table=name,
                             file=file, column=col_name) from None


def _check_int64_range(name, file, col_name, col, row0):
    over = pc.greater(col, pa.scalar(_MAX_INT64, pa.uint64()))
    if pc.any(over).as_py():
        row = row0 + pc.index(over, True).as_py()
        raise InputError(f"column {col_name!r} has a value above the int64 range at row {row} "
                         f"(0-based)", table=name, file=file, column=col_name, row=row)


def _check_nulls(name, file, table: pa.Table, row0: int) -> None:
    for col_name in table.column_names:
        col = table.column(col_name)
        if col_name not in NULLABLE[name] and col.null_count:
            _raise_null(name, file, table, col_name, pc.index(pc.is_null(col), True).as_py(),
                        row0, "has a null value; the column is not nullable")
        if pa.types.is_null(col.type) or col_name in NULL_ENTRIES_OK:
            continue
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            _check_null_entries(name, file, table, col_name, row0)


def _has_strings(t: pa.DataType) -> bool:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_strings(t.value_type)
    return _is_stringish(t)


def _valid_utf8(arr: pa.Array) -> bool:
    """What ``arr.validate(full=True)`` says of a string-holding array (one that passed the quick
    ``validate()``), by its quick way when that can only say yes (:func:`_ascii_strings`): Arrow
    checks each string in turn, a cost per string that the byte scan does not have
    (docs/decisions-io.md, the UTF-8 check)."""
    if _ascii_strings(arr):
        return True
    try:
        arr.validate(full=True)  # checks offsets and, for string data, UTF-8
    except (pa.ArrowInvalid, pa.ArrowIndexError):
        return False
    return True


def _ascii_strings(arr: pa.Array) -> bool:
    """A string or large_string array, or a list or large_list of those (nested any depth), that
    Arrow's full validation must pass: not empty (an empty one goes to Arrow, whose check of it
    costs nothing and looks at its lone offset), a null count its validity bitmap agrees with,
    sound offsets (:func:`_offsets_ok`) and strings whose bytes are all below 0x80 (ASCII is
    valid UTF-8 however it is cut into strings). A list's values must pass too, looked at whole,
    whatever part of them the list reaches, as Arrow's full validation looks at them. Any other
    type (string_view, binary) is False: Arrow decides."""
    t = arr.type
    if len(arr) == 0 or not _null_count_agrees(arr):
        return False
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _list_offsets_ok(arr) and _ascii_strings(arr.values)
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)) or not _offsets_ok(arr):
        return False  # _offsets_ok of another type would run the full validation this one precedes
    off = offsets_view(arr.buffers()[1], pa.types.is_large_string(arr.type), arr.offset, len(arr))
    lo, hi = int(off[0]), int(off[-1])
    return hi == lo or int(np.frombuffer(arr.buffers()[2], dtype=np.uint8, count=hi - lo, offset=lo).max()) < 0x80


def _null_count_agrees(arr: pa.Array) -> bool:
    """The array's null count is what its validity bitmap holds (Arrow's full validation
    compares them; a hand-built array can say otherwise)."""
    bitmap = arr.buffers()[0]
    if bitmap is None:
        return arr.null_count == 0
    n, first = len(arr), arr.offset
    nbytes = (first + n + 7) // 8
    if bitmap.size < nbytes:
        return False
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8, count=nbytes), bitorder="little")[first:first + n]
    return n - int(np.count_nonzero(bits)) == arr.null_count


def _first_invalid(arr: pa.Array) -> int:
    """Index of the first element of ``arr`` that fails full validation (bisection)."""
    lo, hi = 0, len(arr)  # invariant: the first bad element is in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _valid_utf8(arr.slice(lo, mid - lo)):
            lo = mid
        else:
            hi = mid
    return lo


def _list_offsets_ok(arr: pa.Array) -> bool:
    """A non-empty list array's offsets never fall and stay inside its values."""
    off = offsets_view(arr.buffers()[1], pa.types.is_large_list(arr.type), arr.offset, len(arr))
    return off is not None and offsets_rise_within(off, len(arr.values))


def _offsets_ok(arr: pa.Array) -> bool:
    """A string or list<string> array's offsets are safe to read: what only Arrow's full
    validation checks (its quick one, which ``_normalize_column`` ran, checks buffer sizes and
    the end offsets), offsets that never fall and stay inside their data. The UTF-8 of the
    bytes is not looked at."""
    t = arr.type
    if len(arr) == 0:  # may come without buffers
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _list_offsets_ok(arr) and _offsets_ok(arr.values)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        data = arr.buffers()[2]
        off = offsets_view(arr.buffers()[1], pa.types.is_large_string(t), arr.offset, len(arr))
        return off is not None and offsets_rise_within(off, data.size if data is not None else 0)
    return _valid_utf8(arr)  # another string type: its full validation, here and now


def validate_offsets(name, file, table: pa.Table, row0: int = 0) -> None:
    """Every string column's offsets are safe to read (:func:`_offsets_ok`), so joins and
    Arrow's compute functions may run before :func:`validate_utf8` does. A column that fails gets
    :func:`validate_utf8` at once, whose error it would have raised (full validation covers the
    offsets); the fallback message below is for a failure that one does not see."""
    for col_name in table.column_names:
        col = table.column(col_name)
        if _has_strings(col.type) and not all(_offsets_ok(chunk) for chunk in col.chunks):
            validate_utf8(name, file, table, row0)
            raise InputError(f"column {col_name!r} has string offsets outside its data", table=name,
                             file=file, column=col_name)


def validate_list_offsets(name, file, table: pa.Table) -> None:
    """Every list column of numbers (tokens, logprobs, item and output keys) has offsets that
    never fall and stay inside its values: Arrow's quick validation checks only the end ones,
    and a hand-built array given to the API can hold any in between. (Read from Parquet they
    always hold; string lists are :func:`validate_offsets`' and :func:`validate_utf8`'s.)"""
    for col_name in table.column_names:
        t = table.column(col_name).type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or _has_strings(t):
            continue
        if not all(len(chunk) == 0 or _list_offsets_ok(chunk) for chunk in table.column(col_name).chunks):
            raise InputError(f"column {col_name!r} has list offsets that fall or point outside its values",
                             table=name, file=file, column=col_name)


def validate_utf8(name, file, table: pa.Table, row0: int = 0) -> None:
    """Strings must be valid UTF-8 (Parquet readers do not check it): an id with invalid bytes
    cannot be compared, printed or written back reliably, so it is unusable input."""
    for col_name in table.column_names:  # canonical order: rollout_id first
        col = table.column(col_name)
        if not _has_strings(col.type):
            continue
        base = 0
        for chunk in col.chunks:
            if not _valid_utf8(chunk):
                if len(chunk) == 0:  # no row to name: an empty chunk whose lone offset Arrow refuses
                    raise InputError(f"column {col_name!r} has an empty chunk that is not a valid array "
                                     f"(its offsets)", table=name, file=file, column=col_name)
                row = base + _first_invalid(chunk)
                where = f"row {row0 + row} (0-based"
                if col_name != "rollout_id" and "rollout_id" in table.column_names:
                    rid = table.column("rollout_id")[row].as_py()
                    if rid is not None:
                        where += f", rollout {rid!r}"
                raise InputError(f"column {col_name!r} holds a string that is not valid UTF-8: "
                                 f"first at {where})", table=name, file=file, column=col_name,
                                 row=row0 + row)
            base += len(chunk)


def _check_null_entries(name, file, table, col_name, row0):
    base = 0
    for chunk in table.column(col_name).chunks:
        flat = pc.list_flatten(chunk)
        if flat.null_count:
            pos = pc.index(pc.is_null(flat), True).as_py()
            row = base + pc.list_parent_indices(chunk)[pos].as_py()
            _raise_null(name, file, table, col_name, row, row0,
                        "has a list with a null entry; entries may not be null")
        base += len(chunk)


def _raise_null(name, file, table, col_name, row, row0, what):
    where = f"row {row0 + row} (0-based"
    if "rollout_id" in table.column_names and col_name != "rollout_id":
        rid = table.column("rollout_id")[row].as_py()
        if rid is not None:
            where += f", rollout {rid!r}"
    raise InputError(f"column {col_name!r} {what}: first at {where})", table=name, file=file,
                     column=col_name, row=row0 + row)


def normalize(name: str, table: pa.Table, columns: Sequence[str], file: Path | None = None,
              row0: int = 0, utf8_check=None) -> pa.Table:
    """Cast a validated table (from one file) to the canonical types, add the missing
    fill-with-null optional columns, check UTF-8 and nulls. ``row0``: file row of the table's
    first row (for messages). ``utf8_check``: called as ``utf8_check(name, file, table, row0)``
    on the cast table where the UTF-8 check belongs (None: :func:`validate_utf8`, here and now); a
    caller that runs it elsewhere owns raising its error in this order, and the string offsets
    are checked here first (:func:`validate_offsets`), so nothing reads outside a buffer meanwhile.
    Raises InputError."""
    arrays, fields = [], []
    for col_name in columns:
        canon = CANONICAL[name].field(col_name)
        if col_name in table.column_names:
            arr = _normalize_column(name, file, col_name, table.column(col_name), row0)
        else:  # optional column absent in this file (FILL_IF_MISSING)
            arr = pa.chunked_array([pa.nulls(table.num_rows, canon.type)], canon.type)
        arrays.append(arr)
        fields.append(pa.field(col_name, arr.type))
    out = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    if utf8_check is None:
        validate_utf8(name, file, out, row0)  # first: the null check's message decodes rollout ids
    else:  # the caller runs the UTF-8 check elsewhere; what reads the strings meanwhile needs sound offsets
        validate_offsets(name, file, out, row0)
        utf8_check(name, file, out, row0)
    validate_list_offsets(name, file, out)  # before anything flattens the lists
    _check_nulls(name, file, out, row0)
    return _empty_for_null_lists(out)


def _empty_for_null_lists(table: pa.Table) -> pa.Table:
    for i, col_name in enumerate(table.column_names):
        col = table.column(i)
        if col_name in NULL_LIST_IS_EMPTY and col.null_count:
            table = table.set_column(i, table.field(i),
                                     pc.fill_null(col, pa.scalar([], col.type)))
    return table


# ----------------------------------------------------------------------------- reading

def read_table(dataset_dir: str | os.PathLike, name: str,
               columns: Sequence[str] | None = None) -> pa.Table:
    """Read, check and normalize a whole table (all files, file order then row order).

    ``columns``: canonical column names to read (None: all, optional ones when present).
    Every file's schema is checked before any data is read. Returns the canonical schema
    (large-offset fallback per column, see module doc); zero files give zero rows.
    """
    return _concat(plan := plan_table(dataset_dir, name, columns), _read_parts(plan))


def _read_parts(plan: TablePlan) -> list[pa.Table]:
    """The plan's files as normalized tables: one per file, or one per group of small files."""
    return [_read_file(plan, unit) if isinstance(unit, int) else unit
            for unit in _grouped(plan, DEFAULT_BATCH_ROWS)]


def _grouped(plan: TablePlan, batch_rows: int) -> Iterator[pa.Table | int]:
    """In read order, for each group of :func:`small_files.file_groups`: the group's normalized
    table (:func:`_read_small_files`), or, for a file read alone (or a group that fell back),
    the file's index."""
    for group in file_groups(plan, batch_rows):
        if len(group) > 1 and (table := _read_small_files(plan, group)) is not None:
            yield table
        else:
            yield from group


READ_PIECE_BYTES = 64 << 20
READ_BATCH_BYTES = 8 << 20


def _read_batch_rows(plan: TablePlan, i: int) -> int:
    """Rows per decoded batch of file ``i``: about READ_BATCH_BYTES of the columns read, decoded
    (smaller batches hold fewer decoding buffers at once), at least 1,024 rows."""
    return max(1024, min(DEFAULT_BATCH_ROWS,
                         READ_BATCH_BYTES * plan.facts[i].num_rows // max(1, plan.read_decoded(i))))


def _read_file(plan: TablePlan, i: int) -> pa.Table:
    """One file, decoded by the streaming paths' reader (:func:`_iter_file`'s settings, so every
    path reads damaged pages alike) and made one chunk per READ_PIECE_BYTES or so. pyarrow's
    whole-file read decodes every row group before it concatenates them (on dictionary-encoded
    token lists a peak of ~4x the table, docs/limits.md "Memory budget"); one chunk per batch
    would leave small chunks to be copied into larger buffers later."""
    file, columns = plan.files[i], plan.read_columns(i)
    with _reading(plan.name, file):
        pf = _stream_reader(file)
        pieces, pending, pending_bytes = [], [], 0
        for batch in pf.iter_batches(batch_size=_read_batch_rows(plan, i), columns=columns):
            pending.append(batch)
            pending_bytes += batch.nbytes
            if pending_bytes >= READ_PIECE_BYTES:
                pieces.append(pa.Table.from_batches(pending).combine_chunks())
                pending, pending_bytes = [], 0
        if pending:
            pieces.append(pa.Table.from_batches(pending).combine_chunks())
        raw = pa.concat_tables(pieces) if pieces else pf.read(columns=columns)  # no rows: the schema
    _check_row_count(plan.name, file, raw.num_rows, pf.metadata.num_rows)
    return normalize(plan.name, raw, plan.columns, file)


def _check_row_count(name, file, got: int, footer: int) -> None:
    """A damaged page header can make pyarrow return fewer rows than the footer promises
    without raising (seen with ``iter_batches``: zero batches for a 155-row file after a bit
    flip in the first page header). A silently short table would mask or drop rollouts, so it
    is an unreadable file."""
    if got != footer:
        raise InputError(f"unreadable Parquet file: read {got} rows but the footer says "
                         f"{footer} (damaged pages?)", table=name, file=file)


def _concat(plan: TablePlan, parts: list[pa.Table]) -> pa.Table:
    if not parts:
        return plan.schema.empty_table()
    fields = []
    for j, col in enumerate(plan.columns):
        types = [p.schema.field(j).type for p in parts]
        same = all(t == types[0] for t in types)
        fields.append(pa.field(col, types[0] if same else
                               _large_form(CANONICAL[plan.name].field(col).type)))
    schema = pa.schema(fields)
    parts = [p if p.schema == schema else p.cast(schema) for p in parts]
    return pa.concat_tables(parts)


def iter_table_batches(dataset_dir: str | os.PathLike, name: str,
                       columns: Sequence[str] | None = None,
                       batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Yield the table as checked, normalized record batches, file by file, in read order
    (files lexicographic, then rows). All files' schemas are checked before the first batch.

    Each batch has at most ``batch_rows`` rows, spans two or more files only when they are small
    (read as one group, :mod:`chainrows.formats.native.small_files`), and has the columns of
    :func:`table_schema` (a batch keeps 64-bit offsets only if it alone overflows 32-bit ones).
    """
    plan = plan_table(dataset_dir, name, columns)
    for unit in _grouped(plan, batch_rows):
        if isinstance(unit, int):
            yield from _iter_file(plan, plan.files[unit], plan.read_columns(unit), batch_rows)
        else:
            yield from unit.to_batches(max_chunksize=batch_rows)


def _read_small_files(plan: TablePlan, group: list[int]) -> pa.Table | None:
    """The small files ``group`` (:func:`small_files.file_groups`) read and normalized as one
    table of one chunk per column; None when reading or checking fails, or when a file gives
    other than its footer's rows: the caller reads them one by one then, for the error of the
    first bad file in read order, naming it and its row."""
    files = [plan.files[i] for i in group]
    try:
        raw = read_group(files, plan.facts[group[0]].schema, plan.read_columns(group[0]), STREAM_BUFFER)
        if raw.num_rows != sum(plan.facts[i].num_rows for i in group):
            return None
        return normalize(plan.name, raw, plan.columns, files[0]).combine_chunks()
    except MemoryError:
        raise
    except (InputError, pa.ArrowException, OSError, ValueError):
        return None


STREAM_BUFFER = 1 << 20


def _stream_reader(source) -> pq.ParquetFile:
    """The reader of every path (in memory, streaming, spill, Ray; ``source`` a path or an open
    file): pre_buffer=True (pyarrow's default) reads ahead the whole file into pool memory,
    which streaming batches must not (docs/decisions-io.md "Streaming reads"); and all paths
    must decode damaged pages alike."""
    return pq.ParquetFile(source, pre_buffer=False, buffer_size=STREAM_BUFFER)


def _iter_file(plan, file, read_cols, batch_rows) -> Iterator[pa.RecordBatch]:
    for _, table in iter_file_tables(plan.name, file, plan.columns, read_cols, batch_rows):
        yield from table.combine_chunks().to_batches()


def iter_file_tables(name: str, file, columns: Sequence[str], read_cols: Sequence[str],
                     batch_rows: int, open_file: Callable[[], object] | None = None,
                     row_groups: range | None = None) -> Iterator[tuple[int, pa.Table]]:
    """One Parquet file of table ``name``, read as every path reads a file (the in-memory and
    streaming readers, spill, Ray): batch by batch, each checked and normalized to ``columns``
    (:func:`normalize`), yielded as ``(row0, table)`` with ``row0`` the batch's first row in the
    file. ``read_cols``: the file's columns to read; ``open_file``: opens the file (e.g. on a
    pyarrow filesystem), by default ``file`` is a local path; ``row_groups``: only these
    consecutive row groups (default: all). Unusable input, a reader error or fewer or more rows
    than the footer promises included, raises InputError naming ``file``."""
    with _reading(name, file):
        pf = _stream_reader(file if open_file is None else open_file())
        md = pf.metadata
        if row_groups is None:
            row0, footer_rows = 0, md.num_rows
            batches = pf.iter_batches(batch_size=batch_rows, columns=read_cols)
        else:
            if row_groups.step != 1 or row_groups.start < 0 or row_groups.stop > md.num_row_groups:
                raise ValueError(f"row groups {row_groups} of a file of {md.num_row_groups}")
            row0 = sum(md.row_group(g).num_rows for g in range(row_groups.start))
            footer_rows = sum(md.row_group(g).num_rows for g in row_groups)
            batches = pf.iter_batches(batch_size=batch_rows, columns=read_cols, row_groups=list(row_groups))
    first, end = row0, row0 + footer_rows
    for batch in _guard(batches, name, file):
        if row0 + batch.num_rows > end:
            _check_row_count(name, file, row0 + batch.num_rows - first, footer_rows)
        yield row0, normalize(name, pa.Table.from_batches([batch]), columns, file, row0)
        row0 += batch.num_rows
    _check_row_count(name, file, row0 - first, footer_rows)


def _guard(batches: Iterable, name: str, file: Path):
    """Re-raise reader errors (not errors of our own code) as InputError."""
    it = iter(batches)
    while True:
        with _reading(name, file):
            batch = next(it, None)
        if batch is None:
            return
        yield batch


class Totals(NamedTuple):
    """A table's rows, and the bytes of the columns chainrows reads from it: uncompressed as
    stored, and estimated once decoded into Arrow (what a read holds in memory)."""

    rows: int
    stored: int
    decoded: int


def footer_totals(dataset_dir: str | os.PathLike, name: str) -> Totals:
    """The :class:`Totals` of table ``name``, from its files' footers (every file's schema
    checked; no data read). Other columns a capture carries beside the format's do not count:
    they are never read."""
    return plan_totals(plan_table(dataset_dir, name))


def plan_totals(plan: TablePlan) -> Totals:
    """The :class:`Totals` of a table's plan (its files' footer facts)."""
    files = range(len(plan.files))
    return Totals(sum(f.num_rows for f in plan.facts), sum(plan.read_stored(i) for i in files),
                  sum(plan.read_decoded(i) for i in files))


def table_schema(dataset_dir: str | os.PathLike, name: str,
                 columns: Sequence[str] | None = None) -> pa.Schema:
    """The canonical schema :func:`read_table` returns (footers only; no data read)."""
    return plan_table(dataset_dir, name, columns).schema


# ----------------------------------------------------------------------------- dataset

@dataclass(frozen=True)
class Dataset:
    """The three SPEC §2 tables, canonical schema, and the files they came from."""

    ledger: pa.Table
    tokens: pa.Table
    rollouts: pa.Table
    files: dict[str, list[Path]]

    @property
    def has_logprobs(self) -> bool:
        """True iff the tokens table has the optional logprobs column."""
        return "logprobs" in self.tokens.column_names

    @property
    def has_accepted(self) -> bool:
        """True iff the rollouts table has the optional accepted_response_ids column."""
        return "accepted_response_ids" in self.rollouts.column_names


def read_dataset(dataset_dir: str | os.PathLike) -> Dataset:
    """Read all three tables; every file of every table is schema-checked before any data is
    read. Raises InputError on unusable input."""
    plans = {n: plan_table(dataset_dir, n) for n in TABLES}
    tables = {n: _concat(p, _read_parts(p)) for n, p in plans.items()}
    return Dataset(tables["ledger"], tables["tokens"], tables["rollouts"],
                   {n: list(p.files) for n, p in plans.items()})
