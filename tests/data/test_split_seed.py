"""The split's own seed and what a split records for the champion gate: the training seed moves no row (nor makes DVC
rerun the split); a project split under another seed is told how to keep its rows; keys of one seed name the rows of
another; a row that leaves and comes back keeps its split; each assignment names its lineage; a time column of text is
read as time or refused; and a split too stratified to fill says what fills it, advice that works when followed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pandas.util import hash_pandas_object
from support.projects import make_project
from support.splits import random_frame, schema_for, splitmix64_by_hand

from trainflow.core.errors import DataError
from trainflow.core.paths import SPLITS, Paths
from trainflow.data import split as sp
from trainflow.data import split_stream
from trainflow.data.schema import ROW_KEY
from trainflow.params import SplitParams, apply_overrides, load_params, parse_override, write_overrides
from trainflow.stages import run_stage

DVC = str(Path(sys.executable).parent / "dvc")


def stages(paths: Paths, *names: str) -> None:
    for name in names:
        run_stage(name, load_params(paths.params), paths)


def test_the_training_seed_moves_no_row_and_leaves_the_split_stage_unchanged_for_dvc(tmp_path: Path) -> None:
    paths = Paths(make_project(tmp_path / "p", {"data.source": "builtin:iris", "register.model_name": "iris"}))
    stages(paths, "ingest", "split")
    done = subprocess.run([DVC, "commit", "-f", "ingest", "split"], cwd=paths.root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    before = {p.name: p.read_bytes() for p in sorted(paths.splits.iterdir())}

    write_overrides(paths.params, ["seed=1"])  # another training seed
    status = subprocess.run([DVC, "status", "split", "--json"], cwd=paths.root, capture_output=True, text=True)
    assert status.returncode == 0 and json.loads(status.stdout) == {}, status.stdout  # DVC: nothing to rerun
    stages(paths, "split")  # and rerun anyway: the same bytes
    assert {p.name: p.read_bytes() for p in sorted(paths.splits.iterdir())} == before

    write_overrides(paths.params, ["split.seed=1"])  # the split's own seed does move rows
    stages(paths, "split")
    assert (paths.splits / "test.parquet").read_bytes() != before["test.parquet"]


def test_a_split_made_under_another_seed_says_how_to_keep_it_and_the_advice_keeps_every_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A project whose top-level seed was 7 saved its assignment under seed 7; split.seed defaults to 42."""
    frame = random_frame(500)
    schema = schema_for(frame)
    then = sp.assign(frame, schema, SplitParams(seed=7))
    capsys.readouterr()
    now = sp.assign(frame, schema, SplitParams(), previous=then.assignment)
    assert now.kept == 0
    (note,) = now.notes
    assert note.startswith("split: the saved assignment was made with other settings (seed); every row is assigned")
    assert "set split.seed: 7 in params.yaml (or -S split.seed=7)" in note, note
    advice = re.search(r"-S (split\.seed=\d+)", note)
    assert advice is not None
    followed = SplitParams(**apply_overrides({}, [advice.group(1)])["split"])
    kept = sp.assign(frame, schema, followed, previous=then.assignment)
    assert kept.kept == len(frame) and kept.notes == []
    np.testing.assert_array_equal(kept.split, then.split)
    assert parse_override(advice.group(1)) == (["split", "seed"], 7)


def test_keys_of_one_seed_name_the_rows_of_an_assignment_of_another() -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**64, 1000, dtype=np.uint64)
    for seed in (0, 7, 42, 2**31):
        np.testing.assert_array_equal(sp.unseeded(sp.seeded(keys, seed), seed), keys)
    frame = random_frame(800).assign(**{ROW_KEY: rng.integers(0, 2**63, 800).astype(np.uint64)})
    schema = schema_for(frame)
    three = sp.assign(frame, schema, SplitParams(seed=3))
    nine = sp.assign(frame, schema, SplitParams(seed=9))
    assert three.assignment is not None and nine.assignment is not None
    # Row by row: the split seed 3 gave it, found from the key seed 9 gave it (the hand-written seeded hash).
    raw = hash_pandas_object(frame[[ROW_KEY]], index=False).to_numpy()
    keys_nine = np.array([splitmix64_by_hand(int(k), 9) for k in raw], dtype=np.uint64)
    held = three.assignment.held(keys_nine, nine.assignment.settings)
    assert held is not None
    np.testing.assert_array_equal(held, three.split)
    assert (three.split != nine.split).mean() > 0.2  # another seed is another split
    keyed = sp.assign(frame, schema, SplitParams(seed=9, key=["id"]))
    assert keyed.assignment is not None and three.assignment.held(keys_nine, keyed.assignment.settings) is None


def test_a_row_that_leaves_the_table_and_comes_back_keeps_its_split() -> None:
    """400 rows, then a quarter of them leave while 200 new rows arrive (taking the open places), then they come back:
    each is where it was. (Assigned afresh as new rows, 5 of these 99 moved, a train row among them into test.)"""
    frame = random_frame(600)
    schema = schema_for(frame)
    p = SplitParams(key=["id"])
    first = sp.assign(frame.iloc[:400], schema, p)
    gone = np.zeros(len(frame), dtype=bool)
    gone[:400] = np.random.default_rng(1).random(400) < 0.25
    meanwhile = sp.assign(frame[~gone].reset_index(drop=True), schema, p, previous=first.assignment)
    assert meanwhile.assignment is not None and len(meanwhile.assignment.keys) == len(frame)  # the gone keys kept
    back = sp.assign(frame, schema, p, previous=meanwhile.assignment)
    np.testing.assert_array_equal(back.split[:400], first.split)
    assert back.kept == len(frame) and gone.sum() == 99
    assert back.assignment is not None and back.assignment.generation == 2  # nothing new came


def test_an_assignment_names_its_lineage_and_keeps_it_while_it_is_kept() -> None:
    frame = random_frame(400)
    schema = schema_for(frame)
    p = SplitParams(key=["id"])
    first = sp.assign(frame.iloc[:300], schema, p)
    assert first.assignment is not None and re.fullmatch(r"[0-9a-f]{16}", first.assignment.lineage)
    grown = sp.assign(frame, schema, p, previous=first.assignment)
    assert grown.assignment is not None and grown.assignment.lineage == first.assignment.lineage
    assert grown.assignment.generation == 2
    again = sp.assign(frame.iloc[:300], schema, p)  # afresh from the same rows and settings: the same name
    assert again.assignment is not None and again.assignment.lineage == first.assignment.lineage
    other = sp.assign(frame, schema, SplitParams(key=["id"], seed=5), previous=grown.assignment)
    assert other.assignment is not None and other.assignment.lineage not in ("", first.assignment.lineage)
    assert other.assignment.generation == 3


def test_the_test_rows_record_knows_the_champions_rows_by_lineage_or_by_its_assignment(tmp_path: Path) -> None:
    """TestRows.held_by against an independent reading: the champion's own split of each row (its Result)."""
    frame = random_frame(500)
    schema = schema_for(frame)
    champion = sp.assign(frame.iloc[:400], schema, SplitParams(key=["id"]))
    assert champion.assignment is not None

    class Stored:
        def assignment(self) -> sp.Assignment | None:
            return champion.assignment

        def latest(self, column: str) -> None:
            return None

    def record(result: sp.Result) -> sp.TestRows:
        assert result.assignment is not None and result.since is not None
        a = result.assignment
        return sp.TestRows(a.lineage, a.generation, a.settings, result.test_keys, result.since[result.split == 2])

    grown = sp.assign(frame, schema, SplitParams(key=["id"]), previous=champion.assignment)
    test = np.flatnonzero(grown.split == 2)
    held = record(grown).held_by(champion.assignment.lineage, 1, Stored())
    assert held.clean is not None and held.clean.all() and "extends the champion's" in held.how
    assert held.split is not None
    np.testing.assert_array_equal(held.split < 0, test >= 400)  # new: the appended rows, by key

    reseeded = sp.assign(frame, schema, SplitParams(key=["id"], seed=8), previous=grown.assignment)
    test = np.flatnonzero(reseeded.split == 2)
    held = record(reseeded).held_by(champion.assignment.lineage, 1, Stored())
    expected = np.where(test < 400, champion.split[np.minimum(test, 399)], -1)
    assert held.split is not None and held.clean is not None
    np.testing.assert_array_equal(held.split, expected)
    np.testing.assert_array_equal(held.clean, (expected < 0) | (expected == 2))
    assert f"{int((~held.clean).sum())} of these {len(test)} test rows were in its train or val split" in held.how

    class Lost(Stored):
        def assignment(self) -> sp.Assignment | None:
            return None

    unknown = record(reseeded).held_by(champion.assignment.lineage, 1, Lost())
    assert unknown.clean is None and "not in the DVC cache" in unknown.how


# --- a time column of text -------------------------------------------------------------------------------------------


def timed(days: list[int], as_text: str) -> pd.DataFrame:
    frame = random_frame(len(days))
    if as_text == "iso":  # ISO dates, days after 2025-12-31
        return frame.assign(day=[(pd.Timestamp("2025-12-31") + pd.Timedelta(days=d)).isoformat() for d in days])
    return frame.assign(day=[as_text.format(d) for d in days])


def test_a_time_column_of_text_that_is_not_time_is_refused_naming_it() -> None:
    days = list(range(1, 101))
    frame = timed(days, "day {}")
    with pytest.raises(DataError) as err:
        sp.assign(frame, schema_for(frame, ["x"]), SplitParams(time_column="day"))
    message = str(err.value)
    assert message.startswith("split.time_column: column 'day' holds text that is neither numbers nor ISO timestamps")
    assert "('day 1', 'day 10', 'day 100', ... of 100 distinct values, in the order text sorts" in message
    assert "ingest, then split again" in message


@pytest.mark.parametrize("as_text", ["{}", " {} ", "iso"])
def test_a_time_column_of_numbers_or_iso_dates_as_text_is_split_in_time_order(as_text: str) -> None:
    days = np.random.default_rng(3).permutation(np.arange(1, 201)).tolist()
    frame = timed(days, as_text)
    split = sp.assign(frame, schema_for(frame, ["x"]), SplitParams(time_column="day")).split
    by_number = sp.assign(frame.assign(day=days), schema_for(frame, ["x"]), SplitParams(time_column="day")).split
    np.testing.assert_array_equal(split, by_number)
    order = np.asarray(days)
    assert order[split == 2].min() > order[split == 1].max() > order[split == 1].min() > order[split == 0].max()


def test_a_streamed_time_split_of_text_is_read_the_same_way(tmp_path: Path) -> None:
    days = np.random.default_rng(4).permutation(np.arange(1, 121)).tolist()
    frame = timed(days, "{}")
    frame.to_parquet(tmp_path / "t.parquet", index=False)
    p = SplitParams(time_column="day")
    np.testing.assert_array_equal(
        split_stream.assign_by_time(tmp_path / "t.parquet", p).split, sp.assign(frame, schema_for(frame), p).split
    )
    timed(days, "day {}").to_parquet(tmp_path / "t.parquet", index=False)
    with pytest.raises(DataError, match="holds text that is neither numbers nor ISO timestamps"):
        split_stream.assign_by_time(tmp_path / "t.parquet", p)


# --- a stratified split that cannot fill val or test -----------------------------------------------------------------


def test_200_classes_of_one_row_each_get_advice_that_works_when_followed(tmp_path: Path) -> None:
    """Through ingest and split, following each message's advice as written."""
    root = make_project(tmp_path / "p", {"data.source": "data/raw/c.csv", "data.target": "label"})
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x1": rng.normal(size=200), "x2": rng.normal(size=200)})
    frame.assign(label=[f"c{i}" for i in range(200)]).to_csv(root / "data/raw/c.csv", index=False)
    paths = Paths(root)
    followed: list[str] = []
    for _ in range(4):
        try:
            stages(paths, "ingest", "split")
            break
        except DataError as exc:
            if advice := re.search(r"set (\w+\.\w+): (\w+)", str(exc)):
                followed.append(f"{advice.group(1)}={advice.group(2)}")
            elif raise_ := re.search(r"raise (split\.\w+_fraction)", str(exc)):  # raised as far as it goes
                followed.append(f"{raise_.group(1)}=0.4")
            else:
                raise
            write_overrides(paths.params, [followed[-1]])
    assert followed == ["data.task=classification", "split.stratify=false"], followed
    sizes = [len(pd.read_parquet(paths.split_file(name))) for name in SPLITS]
    assert sizes == [140, 30, 30]


def test_an_empty_split_of_a_stratified_table_advises_what_fills_it() -> None:
    """7 classes of 2 rows and 190 of 1 (204 rows): stratified, each small class spares one row at most, for val or
    for test, and test gets none; unstratified, 142.8, 30.6 and 30.6 rows round to 143, 31, 30 (largest fractional parts
    first, val before test on a tie). Raising the fraction would not help."""
    labels = [f"c{i}" for i in range(7) for _ in range(2)] + [f"s{i}" for i in range(190)]
    frame = pd.DataFrame({"id": np.arange(len(labels)), "x": 0.0, "y": labels})
    p = SplitParams(key=["id"])
    with pytest.raises(DataError) as err:
        sp.assign(frame, schema_for(frame, ["x"]), p)
    assert "set split.stratify: false (-S split.stratify=false)" in str(err.value), str(err.value)
    assert "its 197 classes (190 with a single row) are too small to spare one for" in str(err.value)
    unstratified = sp.assign(frame, schema_for(frame, ["x"]), SplitParams(key=["id"], stratify=False)).split
    assert np.bincount(unstratified, minlength=3).tolist() == [143, 31, 30]
