"""The model card (issue 27 item 4): its numbers recomputed here (the accuracy's bootstrap interval, the class
balance per split, the per-class table), its HTML's embedded plots decoded as real, non-blank PNGs, and `trainflow
models show` printing what was logged with the version."""

from __future__ import annotations

import base64
import io
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from support.projects import blobs

from trainflow.artifacts.predict import ExportedModel
from trainflow.cli import main
from trainflow.core.io import read_json
from trainflow.core.paths import SPLITS, Paths
from trainflow.params import load_params, write_overrides
from trainflow.stages import STAGES, report, run_stage


class Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.sources.append(dict(attrs)["src"] or "")


def test_the_card_holds_the_runs_numbers_and_real_plots(
    csv_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = Paths(csv_project)
    blobs(n=400, separation=1.5).to_csv(csv_project / "data/raw/blobs.csv", index=False)
    for stage in STAGES:
        run_stage(stage, load_params(paths.params), paths)
    md = (paths.reports / "card.md").read_text()
    for title in ("# Model card: blobs v1", "## Lineage", "## Data", "## Test metrics", "## Calibration and classes",
                  "## Plots"):  # fmt: skip
        assert title + "\n" in md, title

    # The accuracy's 95% interval: the same resamples of the test rows, by hand.
    test = pd.read_parquet(paths.split_file("test"))
    exported = ExportedModel.load(paths.final)
    right = exported.outputs(test).argmax(axis=1) == exported.pre.labels(test, "test")
    idx = np.random.default_rng(load_params(paths.params).seed).integers(0, len(test), size=(2000, len(test)))
    boot = right[idx].mean(axis=1)
    interval = f"[{np.quantile(boot, 0.025):.4g}, {np.quantile(boot, 0.975):.4g}]"
    assert f"| accuracy | {right.mean():.4g} | {interval} | higher is better |" in md
    assert np.quantile(boot, 0.025) < right.mean() < np.quantile(boot, 0.975)  # a real interval, not a point

    for name in sorted(test["label"].unique()):  # the class balance, split by split
        counts = [int((pd.read_parquet(paths.split_file(s))["label"] == name).sum()) for s in SPLITS]
        assert f"| {name} | {' | '.join(map(str, counts))} |" in md
    per_class = pd.read_csv(paths.per_class)
    assert f"| {per_class['class'][0]} | {per_class['precision'][0]:.4g} |" in md

    page = (paths.reports / "card.html").read_text()
    images = Images()
    images.feed(page)
    assert len(images.sources) == 3  # training curves, the confusion matrix, ROC and PR
    for src in images.sources:
        assert src.startswith("data:image/png;base64,")
        picture = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        assert picture.format == "PNG" and min(picture.size) > 100
        pixels = np.asarray(picture.convert("L"))
        assert len(np.unique(pixels)) > 10 and (pixels < 128).mean() > 0.001  # drawn on, not blank

    monkeypatch.chdir(csv_project)
    capsys.readouterr()
    assert main(["models", "show", "blobs@champion", "--html", str(tmp_path / "card.html")]) == 0
    assert capsys.readouterr().out == md + "\n"
    assert (tmp_path / "card.html").read_text() == page
    assert any(a.key == "model-card" and a.markdown == md for a in report.artifacts(paths))
    assert main(["models", "show", "blobs/7"]) == 2
    assert "no such version" in capsys.readouterr().err

    # A retrain that exports the same bytes (another train.progress: an instant resume, a new MLflow run) registers
    # no version: its card goes with version 1's run, where `models show` finds it.
    write_overrides(paths.params, ["train.progress=true"])
    for stage in ("train", "evaluate", "register"):
        run_stage(stage, load_params(paths.params), paths)
    reg = read_json(paths.registration)
    assert reg["version"] == 1 and reg["decision"].startswith("no new version")
    capsys.readouterr()
    assert main(["models", "show", "blobs@champion"]) == 0
    assert capsys.readouterr().out == (paths.reports / "card.md").read_text() + "\n"
