"""Training's progress suits where stderr goes: a bar on a terminal; in a log (stderr piped or in a file, as under
DVC or Prefect) a plain line every tenth of the way, no carriage-return redraws; nothing when it is turned off."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from trainflow.core.progress import PlainProgress, progress

REPO = Path(__file__).resolve().parents[2]


def test_plain_progress_is_a_line_every_tenth_of_the_way() -> None:
    out = io.StringIO()
    bar = PlainProgress(95, desc="train", unit="upd", stream=out)
    for n in range(1, 96):
        bar.update(1)
        if n == 50:
            bar.set_postfix(loss="0.4123", refresh=False)
    bar.close()
    lines = out.getvalue().splitlines()
    counts = [int(line.split()[1].split("/")[0]) for line in lines]
    assert counts == [10, 20, 30, 40, 50, 60, 70, 80, 90, 95]  # each tenth (of 95: steps of 10), then the end
    assert lines[0].startswith("train: 10/95 upd (11%)") and lines[-1].startswith("train: 95/95 upd (100%)")
    assert "loss=0.4123" in lines[5] and "loss" not in lines[4]
    resumed = io.StringIO()
    bar = PlainProgress(100, desc="train", unit="upd", initial=100, stream=resumed)
    bar.close()
    assert resumed.getvalue() == ""  # resumed at the end: nothing happened, nothing said


def test_training_into_a_log_writes_plain_lines_not_bars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """stderr piped or in a file (here captured: not a terminal): no carriage-return redraws, at most 11 lines."""
    sys.path.insert(0, str(REPO / "tests" / "engine"))
    try:
        from engine_kit import make_trainer, mlp, table
    finally:
        sys.path.remove(str(REPO / "tests" / "engine"))

    trainer = make_trainer(tmp_path, mlp(), progress=True, epochs=3, batch_size=16)
    trainer.fit(table(), table(seed=1))
    err = capsys.readouterr().err
    assert "\r" not in err  # was tqdm's bar: a redraw per update, kept by the log as text
    lines = [line for line in err.splitlines() if line.startswith("train: ")]
    total = trainer.plan.total
    assert 1 <= len(lines) <= 11 and lines[-1].startswith(f"train: {total}/{total} upd (100%)"), err
    assert "loss=" in lines[-1]


def test_a_terminal_gets_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    from tqdm.auto import tqdm

    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress(10, desc="train", unit="upd")
    bar.close()
    assert isinstance(bar, tqdm)
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    assert isinstance(progress(10, desc="train", unit="upd"), PlainProgress)
    quiet = progress(10, desc="train", unit="upd", enabled=False)
    quiet.update(10)
    quiet.close()
    assert log.getvalue() == ""
