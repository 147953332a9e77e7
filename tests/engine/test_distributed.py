"""Two processes (gloo, CPU) against one: the same maths, the same samples, collective skips, resume across world sizes.

The ranks run through `distributed.launch` (torch's elastic launcher), as the train stage starts them; what each rank
does is in dist_ranks.py. The single-process side is computed here, in this process, with the ordinary trainer.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import dist_ranks
import pytest
import torch
from engine_kit import make_trainer

from trainflow.engine import distributed
from trainflow.engine.data import epoch_order

# 203 rows, windows of 8 x 2 x 2 = 32: 6 whole windows and one of 11 (shards of 5 and 6) per epoch; 4 epochs.
SETTINGS: dict[str, Any] = {"batch_size": 8, "accumulate": 2, "epochs": 4, "eval_every": 9, "log_every": 5}
# 91 sequences in windows of 2 x 2 x 2 = 8: 11 whole ones and one of 3 (shards of 1 and 2) per epoch.
BY_KIND = {"table": SETTINGS, "text": {**SETTINGS, "batch_size": 2}}


def relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    x = torch.cat([a[k].flatten().double() for k in sorted(a)])
    y = torch.cat([b[k].flatten().double() for k in sorted(b)])
    return float((x - y).norm() / y.norm())


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One launch for every strategy x data kind (spawning ranks costs seconds)."""
    tmp = tmp_path_factory.mktemp("two")
    return distributed.launch(2, dist_ranks.exactness, str(tmp), BY_KIND)  # type: ignore[no-any-return]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("kind", ["table", "text"])
def test_two_processes_equal_one_with_twice_the_accumulation(
    two_ranks: dict[str, Any], tmp_path: Path, strategy: str, kind: str
) -> None:
    train, val = dist_ranks.data(kind)
    one = {**BY_KIND[kind], "accumulate": SETTINGS["accumulate"] * 2}
    t = make_trainer(tmp_path, dist_ranks.model(kind), **one)
    t.fit(train, val)
    assert t.state.updates >= 20
    got = two_ranks[f"{strategy}-{kind}"]
    assert t.final_weights is not None
    assert relative(got["weights"], t.final_weights) < 1e-5
    assert relative(got["weights"], dist_ranks.model(kind).state_dict()) > 1e-2  # it trained
    # Summed, not averaged, across ranks (AdamW would hide a factor of world_size in the gradients; the norm does not)
    assert got["grad_norm"] == pytest.approx(float(t.grad_norm), rel=1e-5)
    # The same evaluations at the same updates, and val metrics of the exported weights computed by two ranks (each
    # a share of uneven batches) equal to what one process computes over the whole val set, to the last bit.
    assert [h["update"] for h in got["history"]] == [h["update"] for h in t.state.history]
    t.model.load_state_dict(got["weights"])
    if kind == "table":  # the ranks' val_roc_auc / val_pr_auc too: every rank's scores gathered, then ranked
        t.p = t.p.model_copy(update={"monitor": "val_roc_auc"})
        assert {"val_roc_auc", "val_pr_auc"} <= set(got["metrics"])
    # Each rank ran on cpu_count // 2 threads (distributed.launch): so does this evaluation, for the same kernels
    # (val_ece's float64 sums of confidences see the last bit of the logits, which the thread count can change).
    threads = torch.get_num_threads()
    torch.set_num_threads(max((os.cpu_count() or 1) // 2, 1))
    try:
        assert got["metrics"] == t.evaluate(val, batch_size=16)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow  # a launch of two ranks per strategy: ~8 s each
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_nonfinite_gradient_on_one_rank_is_skipped_by_every_rank(tmp_path: Path, strategy: str) -> None:
    got = distributed.launch(2, dist_ranks.nonfinite_on_rank_1, str(tmp_path), strategy)
    ranks = got["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["applied"] == r["updates"] - 1 for r in ranks), ranks  # one update skipped, the same on both
    if strategy == "ddp":
        assert ranks[0]["hash"] == ranks[1]["hash"]  # replicas stayed equal
    # One process skipping the same update (its whole window poisoned) ends where the two did.
    one = dist_ranks.poisoned_run(tmp_path / "one", None, accumulate=4)
    assert one.state.applied == one.state.updates - 1 == ranks[0]["applied"]
    assert one.final_weights is not None
    assert relative(got["weights"], one.final_weights) < 1e-5
    assert all(torch.isfinite(v).all() for v in got["weights"].values())


def epochs_of(pairs: list[tuple[int, int]]) -> dict[int, Counter[int]]:
    out: dict[int, Counter[int]] = {}
    for epoch, i in pairs:
        out.setdefault(epoch, Counter())[i] += 1
    return out


@pytest.mark.slow  # a launch of two ranks per case: ~7 s each
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_resume_on_another_number_of_processes_keeps_every_epochs_samples(
    tmp_path: Path, before: int, after: int
) -> None:
    """Stop after 9 updates (mid-epoch 2: with one process at a window boundary the two-process run does not have),
    resume with the other world size: every epoch trains on each of its samples exactly once."""
    ckpt = tmp_path / "ckpt"
    first = {**SETTINGS, "max_steps": 9}
    then = {**SETTINGS, "resume": str(ckpt)}
    runs: list[list[tuple[int, int]]] = []  # what each process saw, in the order it trained on it
    for world, settings in ((before, first), (after, then)):
        if world == 1:
            runs.append(dist_ranks.run_recording(str(ckpt), settings))
        else:
            runs += distributed.launch(2, dist_ranks.samples_seen, str(ckpt), settings)
    per_epoch = epochs_of([p for run in runs for p in run])
    assert sorted(per_epoch) == [0, 1, 2, 3]
    for epoch, counts in per_epoch.items():
        assert counts == Counter(range(203)), f"epoch {epoch}: repeated {[i for i, c in counts.items() if c > 1]}"
        position = {i: k for k, i in enumerate(epoch_order(203, 7, epoch).tolist())}
        for run in runs:  # each process walks the epoch's own order forward
            mine = [position[i] for e, i in run if e == epoch]
            assert mine == sorted(mine)
