"""Train/val/test split of the processed table: exact fractions, stratified by class, stable under appended rows.

Every row has a key: the 64-bit hash of its `split.key` columns, of its `split.group_by` column, or of the whole row,
seeded by `split.seed` (the split's own seed: the top-level seed trains, and never moves a row). Rows with one key (a
group, or duplicate rows) always share a split. The split of every key is saved with the splits (`assignment.parquet`),
and the next split with the same settings (seed, fractions, stratification, key columns) keeps every saved key where it
was, also the keys of rows that have left the table, should they come back: appending (or removing and restoring) rows
never moves an existing row, so what was test stays test and a model is never trained on rows it was once evaluated on.

An assignment started afresh (the first, or after a change of settings) gets a lineage id, a hash of its settings, its
keys and its generation, which every later assignment that keeps it carries. A registered version is tagged with it:
two versions of one lineage were split alike, row for row, so none was tested on rows the other trained on (the
champion gate relies on it, and looks the rows up key by key in the older assignment otherwise).

Sizes are exact. Within each stratum — a class, with `split.stratify` on a classification task; else the whole table —
each split holds the stratum's rows times its fraction, rounded up or down (within one row), and the split totals are
exact the same way whenever the strata allow it (always for a fresh split of rows with distinct keys). Every class
keeps at least one row in train; a class too small to reach val or test stays in train, with a warning, never an
error. New keys take the places that keep each stratum at its fractions: a stratum's new rows, in the order of their
keys (a seeded random order), fill its new test places first, then val, then train.

`split.time_column` instead sorts the rows by time: the oldest train, later ones validate, the newest test, and rows
with equal timestamps are never on two sides of a boundary. Text is read as numbers or ISO timestamps, or refused (as
text, "day 60" sorts before "day 7"). It is deliberately not stable under appends (newer rows push the boundaries
forward) and saves no assignment.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
from pandas.util import hash_pandas_object

from trainflow.core.errors import DataError
from trainflow.core.paths import SPLITS
from trainflow.data.schema import ROW_KEY, Schema
from trainflow.params import SplitParams

TRAIN, VAL, TEST = 0, 1, 2  # indices into SPLITS
ASSIGNMENT = "assignment.parquet"
TEST_ROWS = "test_rows.parquet"  # per row of test.parquet, in its order: its key and the generation it arrived in
FORMAT = 2  # of the saved assignment; a change starts every project's assignment afresh (2: keys depend on the seed)
_MAX_LISTED = 10
# The proper non-empty subsets of the three splits, for the feasibility test in `quotas`.
_SUBSETS = [s for k in (1, 2) for s in itertools.combinations(range(3), k)]


def seed_word(seed: int) -> np.uint64:
    """The 64-bit word `seeded` mixes into every key for `seed`."""
    return np.uint64(int.from_bytes(hashlib.blake2b(f"trainflow.split:{seed}".encode(), digest_size=8).digest(), "big"))


def seeded(keys: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64's finaliser of (key XOR the seed's word): a bijection of uint64, so distinct keys stay distinct, and
    another seed orders them otherwise. (pandas mixes its hash_key into strings only, never into numbers: seeding
    through it left the raw-row key, a number, the same for every seed.)"""
    z = keys.astype(np.uint64) ^ seed_word(seed)
    with np.errstate(over="ignore"):  # multiplication modulo 2**64 is the point
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def unseeded(keys: np.ndarray, seed: int) -> np.ndarray:
    """The inverse of `seeded`: each step of splitmix64's finaliser undone (an xorshift by its repeated shifts, a
    multiplication by the constant's inverse modulo 2**64), then the seed's word taken off."""
    z = keys.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = z ^ (z >> np.uint64(31)) ^ (z >> np.uint64(62))
        z = z * np.uint64(pow(0x94D049BB133111EB, -1, 2**64))
        z = z ^ (z >> np.uint64(27)) ^ (z >> np.uint64(54))
        z = z * np.uint64(pow(0xBF58476D1CE4E5B9, -1, 2**64))
        z = z ^ (z >> np.uint64(30)) ^ (z >> np.uint64(60))
    return z ^ seed_word(seed)


def row_keys(frame: pd.DataFrame, columns: list[str], seed: int, integral: dict[str, bool] | None = None) -> np.ndarray:
    """The seeded 64-bit hash (uint64) of each row's `columns`: a function of those values alone. The raw-row key
    (ROW_KEY) is hashed as it is; other columns (split.key, split.group_by) as text, numbers without a fraction as
    integers, so an id reads the same whether it is a feature (typed) or not (as read): 3, 3.0 and "3" are one id.

    `integral`: per float column, whether all of the whole column's values are whole numbers (`whole_numbers`), for
    a `frame` that is a block of the table's rows; else each column of `frame` is judged on its own."""
    # Column by column, so `frame` can be a stream.ParquetColumns (a table read a column at a time).
    table = pd.DataFrame(
        {c: frame[c] if columns == [ROW_KEY] else _canonical(frame[c], (integral or {}).get(c)) for c in columns}
    )
    return seeded(hash_pandas_object(table, index=False).to_numpy(dtype=np.uint64), seed)


def whole_numbers(s: pd.Series) -> bool | None:
    """For a float column: whether every finite value is a whole number (then it is hashed as integers); else None."""
    if not pd.api.types.is_float_dtype(s.dtype):
        return None
    x = s.to_numpy(dtype=np.float64, na_value=np.nan)
    finite = x[np.isfinite(x)]
    return bool(np.array_equal(finite, np.round(finite)))


def _canonical(s: pd.Series, integral: bool | None = None) -> pd.Series:
    if integral is None:
        integral = whole_numbers(s)
    if integral and pd.api.types.is_float_dtype(s.dtype):
        return s.astype("Int64").astype("string")
    return s.astype("string")


@dataclass
class Assignment:
    """The split of every key (sorted, unique uint64 keys), and the settings it was made under.

    `since`: the generation of the assignment each key was first assigned in; `generation` counts the assignments
    that added keys (1 for the first). `lineage`: the id of the assignment this one extends ("" for one saved before
    lineages). A registered version is tagged with both, so a later comparison can tell the test rows its champion
    never saw (new data) from the ones it did: within one lineage, the keys it had are those from its generation or
    before (a key is never dropped, so that holds exactly)."""

    keys: np.ndarray
    split: np.ndarray
    settings: dict[str, Any]
    since: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    generation: int = 0
    lineage: str = ""

    def __post_init__(self) -> None:
        if len(self.since) != len(self.keys):  # an assignment saved before generations: every key from generation 0
            self.since = np.zeros(len(self.keys), dtype=np.int32)

    def _saved(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """`values` (one per saved key) of each of `keys`, -1 for a key not saved."""
        out = np.full(len(keys), -1, dtype=values.dtype)
        if len(self.keys):
            pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            found = self.keys[pos] == keys
            out[found] = values[pos[found]]
        return out

    def generation_of(self, keys: np.ndarray) -> np.ndarray:
        """The generation each of `keys` was first assigned in (int32), -1 for a key not saved."""
        return self._saved(keys, self.since)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The saved split of each of `keys` (int8), -1 for a key not saved."""
        return self._saved(keys, self.split)

    def held(self, keys: np.ndarray, settings: dict[str, Any]) -> np.ndarray | None:
        """The split this assignment gave each of `keys`, keys of an assignment made under `settings` (int8; -1: a row
        it never held), or None where its keys hash other columns than those (no key of one names a row of the
        other). Keys of another seed are mapped through the unseeded hash: `seeded` is a bijection."""
        mine, theirs = self.settings, settings
        if any(mine.get(k) != theirs.get(k) for k in ("format", "mode", "columns")):
            return None
        if mine["seed"] != theirs["seed"]:
            keys = seeded(unseeded(keys, int(theirs["seed"])), int(mine["seed"]))
        return self.lookup(keys)

    def save(self, path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table(
            {
                "key": pa.array(self.keys, pa.uint64()),
                "split": pa.array(self.split, pa.int8()),
                "since": pa.array(self.since, pa.int32()),
            }
        )
        pq.write_table(table.replace_schema_metadata(metadata(self.settings, self.generation, self.lineage)), path)

    @classmethod
    def read(cls, path: Path) -> Assignment:
        """The assignment saved at `path` (raises what pyarrow, json or a missing field raise)."""
        import pyarrow.parquet as pq

        file = pq.ParquetFile(path)
        saved = file.schema_arrow.metadata or {}
        settings = json.loads(saved[b"trainflow"])

        def column(name: str, dtype: type) -> np.ndarray:  # one column's Arrow copy held at a time, not the file's
            return np.asarray(file.read(columns=[name]).column(0).to_numpy(), dtype=dtype)

        keys = column("key", np.uint64)
        split = column("split", np.int8)
        since = column("since", np.int32) if "since" in file.schema_arrow.names else np.zeros(len(keys), np.int32)
        generation = int(saved.get(b"generation", b"0"))
        return cls(keys, split, settings, since, generation, saved.get(b"lineage", b"").decode())

    @classmethod
    def load(cls, path: Path) -> Assignment | None:
        """The assignment saved at `path`; None (with a note on stderr) if there is none or it cannot be read."""
        if not path.is_file():
            return None
        try:
            return cls.read(path)
        except Exception as exc:  # noqa: BLE001 - an unreadable record only means no row is kept where it was
            print(
                f"split: cannot read {path} ({type(exc).__name__}: {exc}); assigning every row afresh", file=sys.stderr
            )
            return None


def metadata(settings: dict[str, Any], generation: int, lineage: str) -> dict[str, str]:
    """The saved assignment's Parquet metadata (an assignment from before lineages had none: "")."""
    out = {"trainflow": json.dumps(settings, sort_keys=True), "generation": str(generation)}
    return out | ({"lineage": lineage} if lineage else {})


def lineage_hash(settings: dict[str, Any]) -> Any:
    """The hash an assignment started afresh is named by: its settings, then (`update`) its keys in key order, then
    (`lineage_id`) its generation. Two assignments named alike were made of the same keys under the same settings,
    so every row is in the same split in both."""
    h = hashlib.blake2b(digest_size=8)
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h


def lineage_id(h: Any, generation: int) -> str:
    h.update(f"generation {generation}".encode())
    return str(h.hexdigest())


def with_gone(
    keys: np.ndarray, split: np.ndarray, since: np.ndarray, saved: Assignment | None, lo: int = 0, hi: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`keys` (sorted, unique) with their split and generation, and the saved keys `saved.keys[lo:hi]` that are not
    among them (rows that left the table) with theirs, in key order: a row that comes back finds its split."""
    if saved is None:
        return keys, split, since
    old = saved.keys[lo:hi]
    if len(keys) and len(old):
        pos = np.minimum(np.searchsorted(keys, old), len(keys) - 1)
        gone = keys[pos] != old
    else:
        gone = np.ones(len(old), dtype=bool)
    if not gone.any():
        return keys, split, since
    every = np.concatenate([keys, old[gone]])
    order = np.argsort(every, kind="stable")
    return (
        every[order],
        np.concatenate([split, saved.split[lo:hi][gone]])[order],
        np.concatenate([since, saved.since[lo:hi][gone]])[order],
    )


@dataclass
class Held:
    """Which of this split's test rows another version's split held, and where: `split`, per test row, its split
    there (TRAIN, VAL, TEST; -1 for a row it never held), None where unknown; `clean`, per test row, whether that
    version neither trained nor validated on it (None: unknown, so no row may be compared); `how`: how it is known,
    or why it is not."""

    split: np.ndarray | None
    clean: np.ndarray | None
    how: str


class Stored(Protocol):
    """Another version's splits as stored (by the register stage, from the DVC cache): what `TestRows.held_by` asks."""

    def assignment(self) -> Assignment | None:
        """Its saved assignment, None where there is none (a time split) or it cannot be read."""

    def latest(self, column: str) -> Any | None:
        """The latest time (`time_order`) of its train and val rows in `column`, None where they cannot be read."""


TIME = "time:"  # a time split's lineage: TIME + its column (a time split saves no assignment, so no id)


@dataclass
class TestRows:
    """What the split saved of its test rows for comparisons with other versions: its lineage (an assignment's id, or
    TIME + column for a time split), its assignment's generation and settings, and per test row its key and the
    generation it arrived in, or (a time split) its time. None where the split saved none: a time split has no
    assignment, and splits written before keys were saved have no keys."""

    lineage: str | None
    generation: int | None = None
    settings: dict[str, Any] | None = None
    keys: np.ndarray | None = None
    since: np.ndarray | None = None
    times: pd.Series | None = None

    @classmethod
    def read(cls, splits: Path) -> TestRows:
        """The test rows' record in the folder of splits `splits` (assignment.parquet's metadata, test_rows.parquet)."""
        import pyarrow.parquet as pq

        assignment, rows = splits / ASSIGNMENT, splits / TEST_ROWS
        if not (assignment.is_file() and rows.is_file()):
            return cls(None)
        saved = pq.read_schema(assignment).metadata or {}
        table = pq.read_table(rows)
        return cls(
            saved[b"lineage"].decode() if b"lineage" in saved else None,
            int(saved[b"generation"]) if b"generation" in saved else None,
            json.loads(saved[b"trainflow"]) if b"trainflow" in saved else None,
            table.column("key").to_numpy() if "key" in table.column_names else None,
            table.column("since").to_numpy(),
        )

    @classmethod
    def by_time(cls, column: str, times: pd.Series) -> TestRows:
        """A time split's test rows: their times in `column`."""
        return cls(TIME + column, times=time_order(times.reset_index(drop=True), column))

    def held_by(self, lineage: str | None, generation: int | None, other: Stored) -> Held:
        """Which test rows another version's split held: a version trained on split lineage `lineage` at `generation`
        (its tags), whose stored splits are `other`."""
        if self.times is not None:  # a time split
            if lineage != self.lineage:
                return Held(None, None, f"this split is by time ({self.lineage}) and the champion's was not, or by "
                                        "another column: it saved no record of these rows")  # fmt: skip
            column = self.lineage.removeprefix(TIME) if self.lineage else ""
            latest = other.latest(column)
            if latest is None:
                return Held(None, None, "the champion's splits are not in the DVC cache")
            try:
                clean = (self.times > latest).to_numpy(dtype=bool)
            except TypeError as exc:
                return Held(None, None, f"its times in {column!r} do not compare with these ({exc})")
            how = (f"both splits are by time ({column!r}): {int((~clean).sum())} of these {len(clean)} test rows are "
                   f"no later than the champion's latest train or val row ({latest})")  # fmt: skip
            return Held(None, clean, how)
        n = len(self.since) if self.since is not None else 0
        if self.lineage and lineage == self.lineage and generation is not None and self.since is not None:
            held = np.where(self.since <= generation, TEST, -1).astype(np.int8)
            how = (f"this split extends the champion's (assignment {lineage}, generation {generation}), where a row "
                   "never changes split: each test row was a test row there too, or new")  # fmt: skip
            return Held(held, np.ones(n, dtype=bool), how)
        if self.keys is None or self.settings is None:
            return Held(None, None, "this split saved no row keys (written by an older trainflow: split again)")
        saved = other.assignment()
        if saved is None:
            why = "the champion's split was another assignment, and it is not in the DVC cache"
            return Held(None, None, why if not (lineage or "").startswith(TIME) else "the champion's split was by time")
        there = saved.held(self.keys, self.settings)
        if there is None:
            mine, theirs = self.settings, saved.settings
            return Held(None, None, f"the champion's split keyed rows by {theirs.get('mode')} {theirs.get('columns')}, "
                                    f"this one by {mine.get('mode')} {mine.get('columns')}: no key of one names a row "
                                    "of the other")  # fmt: skip
        clean = (there < 0) | (there == TEST)
        changed = sorted(k for k in self.settings if saved.settings.get(k) != self.settings[k])
        made = f"made with other settings: {', '.join(changed)}" if changed else "made afresh"
        how = (f"the champion's split was another assignment ({made}), looked up key by key: {int((~clean).sum())} "
               f"of these {n} test rows were in its train or val split")  # fmt: skip
        return Held(there, clean, how)


@dataclass
class Result:
    """The split of every row (int8 indices into SPLITS), the assignment to save, and what happened."""

    split: np.ndarray
    assignment: Assignment | None
    kept: int = 0  # rows whose key kept its saved split
    exact: bool = True  # every split's total within one row of its fraction (always, unless appends forbid it)
    notes: list[str] = field(default_factory=list)  # warnings shown to the user
    since: np.ndarray | None = None  # per row: the assignment generation its key was first assigned in
    test_keys: np.ndarray | None = None  # per test row, in table order: its key (uint64)


def assign(frame: pd.DataFrame, schema: Schema, p: SplitParams, previous: Assignment | None = None) -> Result:
    """Split every row of `frame`, keeping the keys `previous` (made under the same settings) saved where they were.

    Raises DataError for an unknown column, a time column that is not time, missing timestamps, or an empty split.
    """
    _check_columns(frame, p)
    result = Result(_by_time(frame, p), None) if p.time_column is not None else _by_key(frame, schema, p, previous)
    _check_not_empty(result.split, frame, p, schema)
    return result


def split_frame(
    frame: pd.DataFrame, schema: Schema, p: SplitParams, previous: Assignment | None = None
) -> tuple[dict[str, pd.DataFrame], Result]:
    """The train/val/test subsets of `frame` by `assign`, each in table order with a fresh 0..n-1 index."""
    result = assign(frame, schema, p, previous)
    rows = frame.drop(columns=[ROW_KEY], errors="ignore")  # the key is the split's business: not in the split files
    parts = {name: rows.iloc[np.flatnonzero(result.split == i)].reset_index(drop=True) for i, name in enumerate(SPLITS)}
    return parts, result


# --- keyed splits ----------------------------------------------------------------------------------------------------


def settings(frame: pd.DataFrame, schema: Schema, p: SplitParams) -> dict[str, Any]:
    """What a saved assignment must have been made under to be kept: the same keys, fractions and strata."""
    if p.group_by is not None:
        mode, columns = "group_by", [p.group_by]
    elif p.key is not None:
        mode, columns = "key", list(p.key)
    elif ROW_KEY in frame.columns:  # the raw row's key from ingest: no feature choice or typing changes it
        mode, columns = "row", [ROW_KEY]
    else:  # a table from before row keys: its columns
        mode, columns = "row", _row_columns(frame, schema)
    stratified = p.stratify and schema.task == "classification"
    return {
        "format": FORMAT,
        "seed": p.seed,  # an assignment made under the top-level seed, when it keyed the split, has it here too
        "val_fraction": p.val_fraction,
        "test_fraction": p.test_fraction,
        "mode": mode,
        "columns": columns,
        "stratify_by": schema.target if stratified else None,
    }


def _by_key(frame: pd.DataFrame, schema: Schema, p: SplitParams, previous: Assignment | None) -> Result:
    current = settings(frame, schema, p)
    previous, last, notes = usable(previous, current)
    keys = row_keys(frame, current["columns"], p.seed)
    # Units: one per distinct key, in key order (the seeded hash: a random order that no row order can change).
    unit_keys, unit_of_row, weight = _units(keys)
    stratum_of_unit, labels = _strata(frame, schema, current["stratify_by"], unit_of_row, len(unit_keys))
    strata = int(stratum_of_unit.max()) + 1 if len(unit_keys) else 0
    fixed = previous.lookup(unit_keys) if previous is not None else np.full(len(unit_keys), -1, dtype=np.int8)

    sizes = np.bincount(stratum_of_unit, weights=weight, minlength=strata).astype(np.int64)
    held = fixed >= 0
    kept = np.zeros((strata, 3), dtype=np.int64)
    np.add.at(kept, (stratum_of_unit[held], fixed[held]), weight[held])
    quota, exact = quotas(sizes, kept, fraction_parts(p))
    split_of_unit = _fill(fixed, stratum_of_unit, weight, quota - kept)

    split = split_of_unit[unit_of_row]
    if labels is not None:
        notes += _small_class_notes(labels, split, frame, schema)
    for note in notes:
        print(note, file=sys.stderr)
    generation = last + 1 if (~held).any() or previous is None else last
    since = np.where(held, previous.generation_of(unit_keys) if previous is not None else 0, generation)
    since = since.astype(np.int32)
    if previous is not None and previous.lineage:
        lineage = previous.lineage
    else:  # afresh, or an assignment saved before lineages: named after what it holds now
        h = lineage_hash(current)
        h.update(np.ascontiguousarray(unit_keys, dtype="<u8").data)
        lineage = lineage_id(h, generation)
    every, split_of_every, since_of_every = with_gone(unit_keys, split_of_unit, since, previous)
    saved = Assignment(every, split_of_every, current, since_of_every, generation, lineage)
    test = split == TEST
    return Result(split, saved, int(weight[held].sum()), exact, notes, since[unit_of_row], keys[test])


def usable(previous: Assignment | None, current: dict[str, Any]) -> tuple[Assignment | None, int, list[str]]:
    """(`previous` if it was made under the `current` settings else None, its generation, notes on why not)."""
    last = previous.generation if previous is not None else 0  # afresh: every key is new, a generation on
    if previous is not None and previous.settings.get("format") != FORMAT:
        note = ("split: the saved assignment was made by an older trainflow, whose row keys did not depend on the "
                "seed; every row is assigned afresh")  # fmt: skip
        return None, last, [note]
    if previous is not None and previous.settings != current:
        changed = sorted(k for k in current if previous.settings.get(k) != current[k])
        note = (f"split: the saved assignment was made with other settings ({', '.join(changed)}); every row is "
                "assigned afresh")  # fmt: skip
        if changed == ["seed"]:
            old = previous.settings.get("seed")
            note += (
                f". It was made with seed {old}, and split.seed is {current['seed']}: the split has a seed of its own "
                "now, and the top-level seed (the training seed) no longer moves rows. To keep every row where it "
                f"was, set split.seed: {old} in params.yaml (or -S split.seed={old}) and split again"
            )
        return None, last, [note]
    return previous, last, []


def _units(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the distinct keys in order, each row's index into them, rows per key): np.unique's answer at less cost."""
    order = np.argsort(keys)
    ordered = keys[order]
    first = np.empty(len(keys), dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    unit_of_row = np.empty(len(keys), dtype=np.int64)
    unit_of_row[order] = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    return ordered[starts], unit_of_row, np.diff(np.append(starts, len(keys)))


def _strata(
    frame: pd.DataFrame, schema: Schema, stratify_by: str | None, unit_of_row: np.ndarray, units: int
) -> tuple[np.ndarray, pd.Index | None]:
    """The stratum of each unit (its class: the most frequent label of its rows, ties to the first label) and the
    class labels; one stratum (0) and None when not stratified."""
    if stratify_by is None:
        return np.zeros(units, dtype=np.int64), None
    if schema.target not in frame.columns:
        raise DataError(
            f"split: the target column {schema.target!r} is not in the processed table (available: "
            f"{_available(frame)}); run `trainflow stage ingest` again"
        )
    # Classes numbered in label order: row order must not change which class the quotas settle first.
    codes, labels = pd.factorize(frame[schema.target], sort=True)
    return unit_strata(codes, len(labels), unit_of_row, units), pd.Index(labels)


def unit_strata(codes: np.ndarray, labels: int, unit_of_row: np.ndarray, units: int) -> np.ndarray:
    """The stratum of each unit from its rows' label codes (-1: missing, a class of its own numbered `labels`)."""
    codes = np.where(codes < 0, labels, codes)
    stratum = np.empty(units, dtype=np.int64)
    stratum[unit_of_row] = codes  # any row's label; right wherever a unit's rows agree (always, when rows are keys)
    mixed = np.flatnonzero(codes != stratum[unit_of_row])
    if len(mixed):  # groups (or ids) whose rows carry different labels: the most frequent, ties to the first label
        units_mixed = np.unique(unit_of_row[mixed])
        rows = np.flatnonzero(np.isin(unit_of_row, units_mixed))
        width = labels + 1
        pairs, counts = np.unique(unit_of_row[rows].astype(np.int64) * width + codes[rows], return_counts=True)
        unit, code = pairs // width, pairs % width
        order = np.lexsort((code, -counts, unit))
        first = order[np.r_[True, unit[order][1:] != unit[order][:-1]]]
        stratum[unit[first]] = code[first]
    return stratum


PARTS = 10**9  # fractions as integer parts per billion, so n * fraction is exact (20 * 0.7 is 13.999... in floats)


def fraction_parts(p: SplitParams) -> np.ndarray:
    """The train, val and test fractions as integers out of PARTS (exact for fractions given with up to 9 decimals)."""
    val, test = round(p.val_fraction * PARTS), round(p.test_fraction * PARTS)
    return np.array([PARTS - val - test, val, test], dtype=np.int64)


def quotas(sizes: np.ndarray, kept: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, bool]:
    """Rows per (stratum, split): each within one row of size * fraction (fraction = weights / PARTS), never fewer
    than the rows already `kept` there, at least one in train; and the column totals within one row of
    total * fraction when that is possible. Returns (quota [strata, 3], whether the totals are that exact).

    Each stratum starts from its lower bounds (the floor of its ideal counts, or what it keeps) and has a few rows left
    over, each of which may go to a split whose ideal count it rounds up. Which splits get them decides the totals: a
    bipartite assignment of the strata's leftover rows to the splits' missing rows. It exists iff for every subset S
    of the splits, the rows S still needs are at most those the strata can give S (Hall's condition); with three
    splits that is six inequalities, so strata are settled one at a time, each taking its best choice (largest
    fractional parts first) that keeps the rest solvable.
    """
    scaled = sizes.astype(np.int64)[:, None] * weights[None, :]  # ideal counts times PARTS, exactly
    floor, remainder = scaled // PARTS, scaled % PARTS
    low = np.maximum(kept, floor)
    low[:, TRAIN] = np.where(sizes > 0, np.maximum(low[:, TRAIN], 1), 0)  # every class trains on one row at least
    high = np.maximum(low, np.maximum(kept, floor + (remainder > 0)))
    extra = sizes - low.sum(axis=1)
    # A stratum whose kept rows leave no rounding that fits (its history is not a split of these fractions): keep
    # what it keeps and give its new rows, one by one, to the split furthest below its ideal count.
    odd = (extra < 0) | (extra > (high - low).sum(axis=1))
    for c in np.flatnonzero(odd):
        low[c] = kept[c]
        for _ in range(int(sizes[c] - kept[c].sum())):
            low[c, int(np.argmax(scaled[c] - low[c] * PARTS))] += 1
        high[c], extra[c] = low[c], 0
    room = (high - low) > 0  # which splits a stratum's leftover rows may go to (one each)

    for targets in _total_candidates(int(sizes.sum()), weights):
        picks = _settle(room, extra, remainder, targets - low.sum(axis=0))
        if picks is not None:
            return low + picks, True
    # No rounding of the totals is reachable (after appends to an unusual history): each stratum on its own.
    picks = np.zeros_like(low)
    for c in np.flatnonzero(extra):
        picks[c, list(_choices(room[c], int(extra[c]), remainder[c])[0])] = 1
    return low + picks, False


def _total_candidates(total: int, weights: np.ndarray) -> list[np.ndarray]:
    """The split totals within one row of total * fraction that sum to total, largest fractional parts first."""
    scaled = total * weights
    floor, remainder = scaled // PARTS, scaled % PARTS
    short = int(total - floor.sum())
    out = []
    for ups in sorted(itertools.combinations(range(3), short), key=lambda c: (-int(remainder[list(c)].sum()), c)):
        if all(remainder[s] > 0 for s in ups):
            targets = floor.copy()
            targets[list(ups)] += 1
            out.append(targets)
    return out


def _choices(room: np.ndarray, extra: int, remainder: np.ndarray) -> list[tuple[int, ...]]:
    """The ways to place `extra` leftover rows, one per split with room, best first: largest fractional parts."""
    options = itertools.combinations(np.flatnonzero(room).tolist(), extra)
    return sorted(options, key=lambda c: (-int(remainder[list(c)].sum()), c))


def _settle(room: np.ndarray, extra: np.ndarray, remainder: np.ndarray, need: np.ndarray) -> np.ndarray | None:
    """Place every stratum's leftover rows so that split s receives exactly need[s] of them; None if impossible."""
    if (need < 0).any() or need.sum() != extra.sum():
        return None
    # Hall: for each subset S of splits, the rows the remaining strata can give S (a stratum gives at most its
    # leftover, and one per split of S it has room in) must cover what S needs.
    give = np.stack([np.minimum(extra, room[:, list(s)].sum(axis=1)) for s in _SUBSETS], axis=1)
    can = give.sum(axis=0)
    if any(need[list(s)].sum() > can[i] for i, s in enumerate(_SUBSETS)):
        return None
    picks = np.zeros_like(room, dtype=np.int64)
    need = need.copy()
    for c in np.flatnonzero(extra):
        can -= give[c]
        for choice in _choices(room[c], int(extra[c]), remainder[c]):
            after = need.copy()
            after[list(choice)] -= 1
            if (after >= 0).all() and all(after[list(s)].sum() <= can[i] for i, s in enumerate(_SUBSETS)):
                picks[c, list(choice)] = 1
                need = after
                break
        else:  # pragma: no cover - Hall's condition held before this stratum, so one of its choices keeps it
            raise AssertionError("split: no placement keeps the quotas solvable")
    return picks


def _fill(
    fixed: np.ndarray, stratum: np.ndarray, weight: np.ndarray, places: np.ndarray, before: np.ndarray | None = None
) -> np.ndarray:
    """The split of every unit: its saved one, or, for new units, the stratum's open places (`places`, rows per
    split) in key order — test first, then val, then train — each unit going where the middle of its rows falls.

    `before`: per stratum, the rows of new units that come before these units in key order (units filled a range of
    keys at a time); it is advanced by these units' rows. Counts are whole numbers, exact in float64."""
    out = fixed.copy()
    new = np.flatnonzero(fixed < 0)
    if len(new) == 0:
        return out
    # By stratum, and within one by key (units are in key order): a stable radix sort of small ints.
    order = new[np.argsort(stratum[new].astype(np.int32), kind="stable")] if stratum.max() > 0 else new
    s, w = stratum[order], weight[order].astype(np.float64)
    cumulative = np.cumsum(w)
    starts = np.r_[True, s[1:] != s[:-1]]
    base = np.maximum.accumulate(np.where(starts, cumulative - w, 0.0))  # rows of the stratum before the unit
    middle = (before[s] if before is not None else 0.0) + (cumulative - base) - w / 2
    if before is not None:
        np.add.at(before, s, w)
    open_ = np.maximum(places, 0)
    test_end = open_[s, TEST]
    val_end = test_end + open_[s, VAL]
    out[order] = np.where(middle < test_end, TEST, np.where(middle < val_end, VAL, TRAIN)).astype(np.int8)
    return out


def _small_class_notes(labels: pd.Index, split: np.ndarray, frame: pd.DataFrame, schema: Schema) -> list[str]:
    codes, _ = pd.factorize(frame[schema.target], sort=True)
    return small_class_notes(labels, class_table(codes, split, len(labels)))


def class_table(codes: np.ndarray, split: np.ndarray, labels: int) -> np.ndarray:
    """Rows per (class, split) of rows with these label codes (-1, a missing label, is not counted)."""
    known = codes >= 0
    return np.bincount(codes[known] * 3 + split[known], minlength=labels * 3).reshape(labels, 3)


def small_class_notes(labels: pd.Index, table: np.ndarray) -> list[str]:
    """The warning for the classes with no row in val or in test (`table`: rows per class and split)."""
    small = [
        f"{label!r} ({int(row.sum())} row{'s' if row.sum() != 1 else ''})"
        for label, row in zip(labels, table)
        if row[VAL] == 0 or row[TEST] == 0
    ]
    if not small:
        return []
    more = f" and {len(small) - _MAX_LISTED} more" if len(small) > _MAX_LISTED else ""
    return [
        f"split: too few rows for val and test, so these classes are in train but missing from val or test (no "
        f"metric covers them there): {', '.join(small[:_MAX_LISTED])}{more}; add rows of them, or merge rare classes"
    ]


# --- time order ------------------------------------------------------------------------------------------------------


def _by_time(frame: pd.DataFrame, p: SplitParams) -> np.ndarray:
    """Oldest rows train, then val, newest test; a boundary inside a run of equal timestamps moves to the nearer end
    of that run (ties to the older side), so no timestamp is on two sides."""
    assert p.time_column is not None
    times = frame[p.time_column]
    n_missing = int(times.isna().sum())
    if n_missing:
        raise DataError(
            f"split.time_column: {n_missing} of {len(frame)} rows have no timestamp in column {p.time_column!r}; "
            "fill or drop them (data.missing: drop) or split without split.time_column"
        )
    times = time_order(times, p.time_column)
    n = len(frame)
    order = times.reset_index(drop=True).sort_values(kind="stable").index.to_numpy()
    ordered = times.to_numpy()[order]
    test_start = _boundary(ordered, n - round(n * p.test_fraction))
    val_start = min(_boundary(ordered, n - round(n * p.test_fraction) - round(n * p.val_fraction)), test_start)
    by_position = np.full(n, TRAIN, dtype=np.int8)
    by_position[val_start:test_start] = VAL
    by_position[test_start:] = TEST
    split = np.empty(n, dtype=np.int8)
    split[order] = by_position
    return split


def time_order(times: pd.Series, column: str) -> pd.Series:
    """`times` as values that sort in time: numbers, timestamps and booleans as they are; text (a column ingest did not
    type: excluded from the features, or categorical) read as numbers, else as ISO timestamps; other text refused,
    since it sorts by its characters ("day 60" before "day 7")."""
    if not (pd.api.types.is_object_dtype(times.dtype) or pd.api.types.is_string_dtype(times.dtype)):
        return times
    text = times.astype("string").str.strip()
    numbers = pd.to_numeric(text, errors="coerce")
    if numbers.notna().all():
        return numbers.astype(np.float64)
    try:
        return pd.Series(pd.to_datetime(text, format="ISO8601", utc=True), index=times.index)
    except (ValueError, TypeError, OverflowError):
        pass
    distinct = text.drop_duplicates()
    examples = ", ".join(repr(v) for v in distinct.sort_values().head(3))
    raise DataError(
        f"split.time_column: column {column!r} holds text that is neither numbers nor ISO timestamps ({examples}, "
        f"... of {len(distinct)} distinct values, in the order text sorts: by its characters, not in time); give the "
        "source a column of numbers (6, 7, 60) or ISO dates (2026-01-06) for it, ingest, then split again; or split "
        "without split.time_column"
    )


def _boundary(ordered: np.ndarray, cut: int) -> int:
    """`cut` (the first position of the newer side) moved out of a run of equal values to the run's nearer end."""
    if cut <= 0 or cut >= len(ordered) or ordered[cut - 1] != ordered[cut]:
        return cut
    value = ordered[cut]
    start = int(np.searchsorted(ordered, value, side="left"))
    end = int(np.searchsorted(ordered, value, side="right"))
    return start if cut - start <= end - cut else end


# --- checks ----------------------------------------------------------------------------------------------------------


def _available(frame: pd.DataFrame) -> str:
    return ", ".join(map(str, frame.columns))


def _check_columns(frame: pd.DataFrame, p: SplitParams) -> None:
    if p.key is not None and not p.key:
        raise DataError("split.key is an empty list: name the id column(s) to hash, or set it to null to hash rows")
    named = [("split.key", c) for c in p.key or []]
    named += [(f"split.{name}", c) for name, c in (("group_by", p.group_by), ("time_column", p.time_column)) if c]
    for param, column in named:
        if column not in frame.columns:
            # Often an earlier data set's -S, kept in params.yaml: say how to reset it for this one.
            kept = [c for c in p.key or [] if c in frame.columns] if param == "split.key" else []
            reset = f"[{', '.join(kept)}]" if kept else "null"
            raise DataError(
                f"{param}: column {column!r} is not in the processed table (for this data: -S '{param}={reset}'); "
                f"available columns: {_available(frame)}"
            )


def _stratified_too_small(frame: pd.DataFrame, schema: Schema, p: SplitParams, split: int) -> bool:
    """Whether `split` is empty because the split is stratified, and would not be without: the classes are too small
    to give it a row, and the same rows unstratified would (exact quotas of the whole table)."""
    if not p.stratify or schema.task != "classification" or p.time_column is not None or p.group_by is not None:
        return False
    one = np.array([len(frame)], dtype=np.int64)
    quota, _ = quotas(one, np.zeros((1, 3), dtype=np.int64), fraction_parts(p))
    return bool(quota[0, split] > 0)


def _row_columns(frame: pd.DataFrame, schema: Schema) -> list[str]:
    """The processed table's columns, in schema order: features, the text column, the target."""
    columns = [*schema.features, *([schema.text_column] if schema.text_column else []), schema.target]
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise DataError(
            f"split: the schema's column(s) {', '.join(map(repr, missing))} are not in the processed table "
            f"(available: {_available(frame)}); run `trainflow stage ingest` again"
        )
    return columns


def _check_not_empty(split: np.ndarray, frame: pd.DataFrame, p: SplitParams, schema: Schema | None = None) -> None:
    """Raise for an empty split, with the change that fills it. `schema`: for a stratified split's advice."""
    sizes = [np.count_nonzero(split == i) for i in range(len(SPLITS))]  # (bincount would copy `split` to int64)
    fractions = {"train": 1 - p.val_fraction - p.test_fraction, "val": p.val_fraction, "test": p.test_fraction}
    for i, name in enumerate(SPLITS):
        if sizes[i]:
            continue
        more = "add rows"
        rows = f"{len(frame)} rows"
        if p.group_by is not None and p.time_column is None:
            rows += f" in {frame[p.group_by].nunique(dropna=False)} groups of split.group_by {p.group_by!r}"
            more = "add groups"
        elif p.time_column is not None:
            rows += f", {frame[p.time_column].nunique()} distinct timestamps"
            more = "add rows with other timestamps"
        fix = "lower split.val_fraction / split.test_fraction" if name == "train" else f"raise split.{name}_fraction"
        if name != "train" and schema is not None and _stratified_too_small(frame, schema, p, i):
            counts = frame[schema.target].value_counts(dropna=False)
            one = int((counts == 1).sum())
            why = (f"every one of the {len(counts)} classes has a single row, so no fraction fills the {name} split"
                   if one == len(counts) else f"its {len(counts)} classes ({one} with a single row) are too small to "
                   f"spare one for {name}")  # fmt: skip
            more = "add rows of the small classes"
            fix = ("set split.stratify: false (-S split.stratify=false) to split the rows whatever their class: a "
                   f"stratified split keeps one row of every class in train, and {why}")  # fmt: skip
        raise DataError(
            f"split: the {name} split is empty ({rows}, {name} fraction {fractions[name]:g}); {more} or {fix}"
        )
