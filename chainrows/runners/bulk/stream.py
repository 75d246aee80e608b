"""The streaming pass: read the three tables once, side by side, and decide each GRPO group
as soon as all of its rows have been read (chainrows.runners.bulk.windows has the plan)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from chainrows.engine.threads import inherit_threads
from chainrows.errors import InputError
from chainrows.formats.native.dataset import TABLES, iter_table_batches
from chainrows.runners.bulk.windows import WindowPlan, take


def concat(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """Tables of one dataset table as one, whatever offset widths their batches came with."""
    parts = [p for p in parts if p.num_rows] or [schema.empty_table()]
    if any(p.schema != parts[0].schema for p in parts):
        wide = pa.unify_schemas([p.schema for p in parts], promote_options="permissive")
        parts = [p.cast(wide) for p in parts]
    return pa.concat_tables(parts)


def _drain(batches: list) -> Iterator[pa.RecordBatch]:
    """The batches, first to last, each dropped from the list as it is yielded."""
    batches.reverse()
    while batches:
        yield batches.pop()


class RowReader:
    """A table's record batches, handed out as tables of exactly the rows asked for."""

    def __init__(self, name: str, batches: Iterator[pa.RecordBatch]):
        self.name = name
        self._batches = batches
        self._pending: pa.Table | None = None
        self.schema: pa.Schema | None = None

    def read(self, n: int) -> list[pa.Table]:
        out, got = [], 0
        while got < n:
            if self._pending is None or self._pending.num_rows == 0:
                batch = next(self._batches, None)
                if batch is None:
                    raise InputError("table changed while it was read: fewer rows than its first "
                                     "pass counted", table=self.name)
                self._pending = pa.Table.from_batches([batch])
                self.schema = self.schema or batch.schema
            piece = self._pending.slice(0, n - got)
            rest = self._pending.num_rows - piece.num_rows
            self._pending = self._pending.slice(piece.num_rows) if rest else None  # a read table lets go
            out.append(piece)
            got += piece.num_rows
        return out

    def check_exhausted(self) -> None:
        if (self._pending is not None and self._pending.num_rows) or next(self._batches, None) is not None:
            raise InputError("table changed while it was read: more rows than its first pass "
                             "counted", table=self.name)


class Windows:
    """Yields ``(step, {table: rows decided at that step})`` for every step of ``plan``."""

    def __init__(self, dataset_dir, plan: WindowPlan, schemas: dict[str, pa.Schema]):
        self.plan = plan
        self.schemas = schemas
        rows_per_step = {n: max(1, int(plan.cuts[n][-1]) // plan.steps) for n in TABLES}
        self._readers = {}
        for n in TABLES:
            kept = plan.kept.hand_over(n) if plan.kept is not None else None
            batches = _drain(kept) if kept is not None else \
                iter_table_batches(dataset_dir, n, None, max(64, rows_per_step[n] // 4))
            self._readers[n] = RowReader(n, batches)
        self._held: dict[str, list[tuple[pa.Table, np.ndarray]]] = {n: [] for n in TABLES}

    def check_exhausted(self) -> None:
        """After the last step: every table ended where its first pass said (InputError if a
        file gained rows meanwhile)."""
        for reader in self._readers.values():
            reader.check_exhausted()

    def step(self, k: int) -> dict[str, pa.Table]:
        """Read step ``k``'s rows; return the rows of the groups decided at ``k``, in read order."""
        window = {}
        for name in TABLES:
            start, stop = int(self.plan.cuts[name][k]), int(self.plan.cuts[name][k + 1])
            pieces = self._held[name]
            resident = name in self.plan.resident
            if stop > start:
                done = self.plan.done[name][start:stop]
                read = self._readers[name].read(stop - start)
                if resident:  # one piece per record batch: each freed once fully decided
                    at = np.cumsum([0] + [t.num_rows for t in read])
                    pieces = pieces + [(t, done[a:b]) for t, a, b in zip(read, at[:-1], at[1:])]
                else:
                    pieces = pieces + [(concat(read, self.schemas[name]), done)]
            if resident:
                window[name], self._held[name] = self._take_resident(name, pieces, k)
                continue
            now, held = [], []
            for table, done in pieces:
                here, later = np.flatnonzero(done == k), np.flatnonzero(done > k)
                if len(here):
                    now.append(take(table, here, slices=name == "tokens"))  # freed with the window
                if len(later):
                    held.append((take(table, later), done[later]))
            self._held[name] = held
            window[name] = concat(now, self.schemas[name])
        return window

    def _take_resident(self, name: str, pieces: list[tuple[pa.Table, np.ndarray]], k: int):
        """A resident table's rows decided at step ``k``, taken from all its held pieces (record
        batches) at once, one gather per column (a take per piece cost more than its copy: ~90
        pieces a step); the pieces with rows decided later are kept whole (copying their rest
        every step would cost more)."""
        held = [(t, d) for t, d in pieces if np.any(d > k)]
        here = np.flatnonzero(np.concatenate([d for _, d in pieces]) == k) if pieces else ()
        if not len(here):
            return self.schemas[name].empty_table(), held
        return take(concat([t for t, _ in pieces], self.schemas[name]), here, slices=name == "tokens"), held


def stream_windows(dataset_dir, plan: WindowPlan, schemas: dict[str, pa.Schema],
                   decide: Callable[[int, dict[str, pa.Table]], None], skip: set[int] = frozenset()) -> None:
    """Call ``decide(k, window)`` for every step with rows, in step order; the next step's rows
    are read on a second thread meanwhile (Parquet decoding releases the GIL). Steps in
    ``skip`` are read (their rows must be passed) but not decided."""
    windows = Windows(dataset_dir, plan, schemas)
    with ThreadPoolExecutor(1, thread_name_prefix="chainrows-read", **inherit_threads()) as pool:
        ahead = pool.submit(windows.step, 0) if plan.steps else None
        for k in range(plan.steps):
            window = ahead.result()
            ahead = pool.submit(windows.step, k + 1) if k + 1 < plan.steps else None
            try:
                if k not in skip and any(t.num_rows for t in window.values()):
                    decide(k, window)
            except BaseException:
                if ahead is not None:
                    ahead.cancel()
                    try:
                        ahead.result()
                    except BaseException:
                        pass
                raise
            del window
        windows.check_exhausted()
