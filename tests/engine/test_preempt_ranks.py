"""Two ranks (gloo, CPU, a tiny MLP), one of them signalled: both stop after the same update, with one checkpoint, and
the resumed run ends with the uninterrupted run's weights, bit for bit. The default tier's guard of the ranks'
agreement (the maximum of their stop flags): every other preemption test with ranks spawns whole stages (slow tier).

The ranks run through `distributed.launch`, as the train stage starts them; `signalled_once` is what each runs. The
tests set TRAINFLOW_PREEMPT_CHECK_S=0 (the ranks exchange their flags after every update, so a signal in update k
stops them after update k); the last test runs the default cadence, exchanges every N updates."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_kit import make_trainer, mlp, table

from trainflow.core.errors import Preempted
from trainflow.engine import distributed

# 203 rows in windows of 8 x 2 ranks: 13 updates an epoch (the last window 11 rows: rank 1's share is 3), 2 epochs.
SETTINGS: dict[str, Any] = {"batch_size": 8, "epochs": 2, "eval_every": 5, "checkpoint_every": 4}
AT = 9  # the update rank 1 is signalled in: mid-epoch, between two periodic checkpoints


def signalled_once(tmp: str, rows: int = 203) -> dict[str, Any]:
    """On every rank: an uninterrupted run; then a run in which rank 1 alone gets SIGUSR1 during update AT (rank 0
    is never told), and its resumption. Returns, from rank 0, what each rank's stop said and both final weights."""
    group = distributed.init(int(os.environ["WORLD_SIZE"]), "ddp", "gloo", torch.device("cpu"))
    train, val = table(n=rows), table(n=203, seed=1)
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


def test_with_the_default_cadence_the_ranks_exchange_every_n_updates_and_still_stop_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exchanges about every 0.2 s: updates of milliseconds make N large, so the stop comes later than the signal, at
    an update both ranks chose alike (each exchange's N is the ranks' maximum); the resume is still bitwise."""
    monkeypatch.setenv("TRAINFLOW_PREEMPT_CHECK_S", "0.2")  # read by the ranks' fresh interpreters
    got = distributed.launch(2, signalled_once, str(tmp_path), 4000)  # 250 updates an epoch
    stops = [re.search(r"stopped after update (\d+) of 500", said) for said in got["said"]]
    assert all(stops), got["said"]
    at = [int(m.group(1)) for m in stops if m is not None]
    assert at[0] == at[1] > AT + 1, got["said"]  # together, and not at the next update: flags every N > 1 updates
    assert got["resumed_from"] == at[0]
    whole, resumed = got["whole"], got["resumed"]
    assert not [k for k in whole if not torch.equal(whole[k], resumed[k])]
