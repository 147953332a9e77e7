"""The holder of a workspace's lock (trainflow.core.workspace) is named from its record, or as another process
when the record is missing or unreadable."""

from __future__ import annotations

from pathlib import Path


def test_the_holder_of_a_workspace_is_named_from_its_record_or_as_another_process(tmp_path: Path) -> None:
    import datetime
    import json

    from trainflow.core.workspace import holder, lock_file

    record = lock_file(tmp_path).with_suffix(".json")
    assert holder(tmp_path) == "another process"  # no record
    record.parent.mkdir(parents=True, exist_ok=True)
    since = 1_780_000_000.5
    started = datetime.datetime.fromtimestamp(since).strftime("%Y-%m-%d %H:%M:%S")
    record.write_text(json.dumps({"command": "trainflow run", "pid": 4242, "since": since}))
    assert holder(tmp_path) == f"`trainflow run` (pid 4242, since {started})"
    for broken in ("{", json.dumps({"command": "x", "since": since}), json.dumps({"command": "x", "pid": 1,
                   "since": "soon"}), json.dumps({"command": "x", "pid": 1, "since": None}), "[]"):  # fmt: skip
        record.write_text(broken)
        assert holder(tmp_path) == "another process", broken
