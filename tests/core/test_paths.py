"""trainflow.core.paths: the processed table read back, and a missing or damaged one named with how to restore it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from trainflow.core.errors import DataError
from trainflow.core.paths import Paths


def test_a_missing_or_damaged_processed_table_says_how_to_restore_it(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    fix = (
        "restore the version DVC committed with `dvc checkout --force data/processed`, or write it again with "
        "`trainflow stage ingest`"
    )
    with pytest.raises(DataError) as exc:
        paths.read_table()
    assert str(exc.value) == f"{paths.table} is missing; {fix}"
    paths.table.parent.mkdir(parents=True)
    paths.table.write_bytes(b"PAR1 not a parquet file")
    with pytest.raises(DataError) as exc:
        paths.read_table()
    assert str(exc.value).startswith(f"{paths.table} cannot be read, it is corrupt or truncated (")
    assert str(exc.value).endswith(f"); {fix}")
    pd.DataFrame({"a": [1, 2]}).to_parquet(paths.table)
    assert paths.read_table()["a"].tolist() == [1, 2]
