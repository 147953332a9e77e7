"""The MLflow pyfunc (trainflow.serving) loads the exported model from its data folder and predicts a frame, or
a dict as MLflow's JSON input gives it."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_the_pyfunc_loads_the_exported_model_from_its_data_and_predicts_a_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pandas as pd

    from trainflow import serving

    loaded: list[Path] = []

    class Exported:
        def predict_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
            return frame.assign(prediction=frame["x"] * 2)

    monkeypatch.setattr(serving.ExportedModel, "load", staticmethod(lambda path: loaded.append(path) or Exported()))
    model = serving._load_pyfunc(str(tmp_path / "final"))
    assert loaded == [tmp_path / "final"]
    out = model.predict({"x": [1, 2]})  # a dict (MLflow's JSON input) becomes a frame
    pd.testing.assert_frame_equal(out, pd.DataFrame({"x": [1, 2], "prediction": [2, 4]}))
    frame = pd.DataFrame({"x": [5]})
    pd.testing.assert_frame_equal(model.predict(frame, params=None), pd.DataFrame({"x": [5], "prediction": [10]}))
