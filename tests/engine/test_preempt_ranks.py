"""Two ranks (gloo, CPU, a tiny MLP), one of them signalled: both stop after the same update, with one checkpoint, and
the resumed run ends with the uninterrupted run's weights, bit for bit. The default tier's guard of the ranks'
agreement (the maximum of their stop flags): every other preemption test with ranks spawns whole stages (slow tier).

The ranks run through `distributed.launch`, as the train stage starts them; `signalled_once` is what each runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import torch
from engine_kit import make_trainer, mlp, table

from trainflow.core.errors import Preempted
from trainflow.engine import distributed

# 203 rows in windows of 8 x 2 ranks: 13 updates an epoch (the last window 11 rows: rank 1's share is 3), 2 epochs.
SETTINGS: dict[str, Any] = {"batch_size": 8, "epochs": 2, "eval_every": 5, "checkpoint_every": 4}
AT = 9  # the update rank 1 is signalled in: mid-epoch, between two periodic checkpoints


def signalled_once(tmp: str) -> dict[str, Any]:
    """On every rank: an uninterrupted run; then a run in which rank 1 alone gets SIGUSR1 during update AT (rank 0
    is never told), and its resumption. Returns, from rank 0, what each rank's stop said and both final weights."""
    group = distributed.init(int(os.environ["WORLD_SIZE"]), "ddp", "gloo", torch.device("cpu"))
    train, val = table(n=203), table(n=203, seed=1)
    whole = make_trainer(Path(tmp) / "whole", mlp(), group=group, **SETTINGS)
    whole.fit(train, val)

    cut = make_trainer(Path(tmp) / "cut", mlp(), group=group, preempt_signals=["SIGUSR1"], **SETTINGS)
    cut.preemptible = True
    step = cut.train_step

    def train_step(*args: Any, **kwargs: Any) -> None:
        step(*args, **kwargs)
        if group.rank == 1 and cut.state.updates + 1 == AT:  # in update AT, before the trainer counts it
            os.kill(os.getpid(), signal.SIGUSR1)

    cut.train_step = train_step  # type: ignore[method-assign]
    try:
        cut.fit(train, val)
        stopped = "not stopped"
    except Preempted as exc:
        stopped = str(exc)
    said = group.gather(stopped)
    resumed = make_trainer(Path(tmp) / "cut", mlp(), group=group, **{**SETTINGS, "resume": "auto"})
    resumed.fit(train, val)
    distributed.shutdown(group)
    return {"said": said, "whole": whole.final_weights, "resumed": resumed.final_weights,
            "resumed_from": resumed.resumed_from}  # fmt: skip


def test_a_signal_to_one_rank_stops_both_after_the_same_update_and_the_resume_is_bitwise(tmp_path: Path) -> None:
    got = distributed.launch(2, signalled_once, str(tmp_path))
    said = got["said"]
    assert "another rank was told to stop: stopped after update 9 of 26" in said[0], said
    assert "SIGUSR1 received: stopped after update 9 of 26" in said[1], said
    assert got["resumed_from"] == AT
    whole, resumed = got["whole"], got["resumed"]
    assert whole.keys() == resumed.keys()
    differ = [k for k in whole if not torch.equal(whole[k], resumed[k])]
    assert not differ, f"the resumed run's weights differ from the uninterrupted run's in {differ}"
