"""Validation reads the device once: `Trainer.evaluate` accumulates its sums (and, for val_roc_auc / val_pr_auc, every
val score) on the device and reads them back in one transfer, for tables and text, per sample and per token. The
guard is test_host_sync.py's (an ATen dispatch mode for value-dependent ops, in tests/support/host_sync.py); its
`tolist` only counts the reads. Also: the ranked metrics an evaluation reports are sklearn's on the model's own
probabilities."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from engine_kit import make_trainer, mlp, table, text_data, text_model
from sklearn.metrics import average_precision_score, roc_auc_score
from support.host_sync import HostSyncError, _NoSync

from trainflow.core.errors import ParamsError
from trainflow.engine.loaders import Batch, Dataset
from trainflow.models import MLP


class Prebuilt:
    """A dataset's batches built before the guard (text pads on the host: data preparation, not the evaluation)."""

    def __init__(self, data: Dataset, batch_size: int) -> None:
        self.index_device = data.index_device
        self.n = len(data)
        self.batches = [data.batch(torch.arange(s, min(s + batch_size, self.n))) for s in range(0, self.n, batch_size)]
        self.served = 0

    def __len__(self) -> int:
        return self.n

    def batch(self, idx: torch.Tensor) -> Batch:
        self.served += 1
        return self.batches[self.served - 1]


@contextlib.contextmanager
def counted_reads() -> Iterator[list[torch.Size]]:
    """No value-dependent op and no numpy read; each tolist() is recorded (and allowed)."""
    reads: list[torch.Size] = []
    tolist = torch.Tensor.tolist

    def counted(self: torch.Tensor) -> Any:
        reads.append(self.shape)
        return tolist(self)

    def forbidden(*_: Any, **__: Any) -> Any:
        raise HostSyncError("host-device sync in evaluate: numpy()")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.Tensor, "tolist", counted)
        mp.setattr(torch.Tensor, "numpy", forbidden)
        mp.setattr(torch.Tensor, "__array__", forbidden)
        with _NoSync():
            yield reads


CASES = {
    "table": (mlp, lambda: table(n=203)),
    "text": (lambda: text_model("sequence"), lambda: text_data(n=45, per_token=False)),
    "token": (lambda: text_model("token"), lambda: text_data(n=45)),
}


@pytest.mark.parametrize("monitor", ["val_loss", "val_ece", "val_roc_auc"])
@pytest.mark.parametrize("kind", list(CASES))
def test_evaluate_reads_the_device_once(tmp_path: Path, kind: str, monitor: str) -> None:
    model, data = CASES[kind]
    t = make_trainer(tmp_path, model(), monitor=monitor)
    val = Prebuilt(data(), batch_size=16)
    if kind == "token" and monitor == "val_roc_auc":
        with pytest.raises(ParamsError, match="train.monitor: val_roc_auc ranks one score per sample"):
            t.evaluate(val, batch_size=16)  # type: ignore[arg-type]
        return
    with counted_reads() as reads:
        metrics = t.evaluate(val, batch_size=16)  # type: ignore[arg-type]
    assert len(reads) == 1, reads
    assert {"val_loss", "val_accuracy", "val_ece"} <= set(metrics)
    assert ("val_roc_auc" in metrics) is (monitor == "val_roc_auc")


@pytest.mark.parametrize("k", [2, 3])
def test_evaluate_reports_sklearn_ranked_metrics(tmp_path: Path, k: int) -> None:
    """Uneven batches (203 rows by 16), limit_batches cutting the set short: the rows the batches covered, ranked."""
    data = table(n=203, classes=k)
    torch.manual_seed(0)
    t = make_trainer(tmp_path, MLP(6, k, [8], dropout=0.0), monitor="val_pr_auc", limit_batches=11)
    metrics = t.evaluate(data, batch_size=16)
    n = 11 * 16
    with torch.no_grad():
        proba = t.model(data.x[:n]).float().softmax(-1).double().numpy()
    labels = data.y[:n].numpy()
    if k == 2:
        want = roc_auc_score(labels, proba[:, 1]), average_precision_score(labels, proba[:, 1])
    else:
        onehot = np.eye(k)[labels]
        want = roc_auc_score(labels, proba, multi_class="ovr"), average_precision_score(onehot, proba)
    assert (metrics["val_roc_auc"], metrics["val_pr_auc"]) == pytest.approx(want, abs=1e-9)
    assert 0.2 < metrics["val_roc_auc"] < 0.8  # an untrained model: a real ranking, not 0/1 or NaN
