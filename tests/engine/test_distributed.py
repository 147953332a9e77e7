"""Two processes (gloo, CPU) against one: the same maths (BatchNorm's too), samples, collective skips, resume anywhere.

The ranks run through `distributed.launch` (torch's elastic launcher), as the train stage starts them; what each rank
does is in dist_ranks.py. The single-process side is computed here, in this process, with the ordinary trainer.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dist_ranks
import pytest
import torch
from engine_kit import make_trainer
from support.ranks import BY_KIND, SETTINGS, assert_same_history, assert_same_tensors, relative, without_key_bias

from trainflow.core.errors import ParamsError
from trainflow.engine import distributed
from trainflow.engine.checkpoint import Checkpoint, CheckpointStore, load_checkpoint
from trainflow.engine.loaders import block_order, epoch_order


def last_checkpoint(root: Path) -> Checkpoint:
    path = CheckpointStore(root, 1).latest()
    assert path is not None
    return load_checkpoint(path)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One launch for every strategy x data kind (spawning ranks costs seconds)."""
    tmp = tmp_path_factory.mktemp("two")
    return distributed.launch(2, dist_ranks.exactness, str(tmp), BY_KIND)  # type: ignore[no-any-return]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("kind", list(BY_KIND))
def test_two_processes_equal_one_with_twice_the_accumulation(
    two_ranks: dict[str, Any], tmp_path: Path, strategy: str, kind: str
) -> None:
    """The same micro-batches (a partial last window included), so the same gradients, with BatchNorm too: each
    micro-batch normalised with its own statistics, on whichever rank. The running statistics merged after each window
    are one process's, and so are the val metrics of every evaluation, the last checkpoint (weights, statistics,
    optimizer state, progress) and the exported weights."""
    train, val = dist_ranks.data(kind)
    one = {**BY_KIND[kind], "accumulate": SETTINGS["accumulate"] * 2}
    t = make_trainer(tmp_path, dist_ranks.model(kind), **one)
    t.fit(train, val)
    assert t.state.updates >= 20
    got = two_ranks[f"{strategy}-{kind}"]
    assert t.final_weights is not None
    assert_same_tensors(without_key_bias(got["weights"]), without_key_bias(t.final_weights), "exported")
    assert relative(got["weights"], t.final_weights) < 1e-5
    assert relative(got["weights"], dist_ranks.model(kind).state_dict()) > 1e-2  # it trained
    # Every evaluation: the ranks' val metrics (computed with the merged statistics) are one process's.
    assert_same_history(got["history"], t.state.history)
    # The last checkpoint: weights and buffers, every optimizer tensor, and the progress, rank 0's as one process's.
    mine, ranks = last_checkpoint(tmp_path), last_checkpoint(Path(got["checkpoints"]))
    assert_same_tensors(without_key_bias(ranks.tensors["model"]), without_key_bias(mine.tensors["model"]), "model")
    assert relative(ranks.tensors["model"], mine.tensors["model"]) < 1e-5
    assert_same_tensors(ranks.tensors["optimizer"], mine.tensors["optimizer"], "optimizer")
    state, want = ranks.meta["state"], mine.meta["state"]
    assert sorted(state) == sorted(want)
    assert_same_history(state.pop("history"), want.pop("history"))
    for k, v in want.items():
        assert state[k] == (pytest.approx(v, rel=1e-5) if isinstance(v, float) else v), k
    if kind.startswith("image"):  # BatchNorm counts one process's micro-batches: 3 x 4 + 3 (or 2) per epoch
        tracked = [v for k, v in mine.tensors["model"].items() if k.endswith("num_batches_tracked")]
        assert len(tracked) == 6 and {int(v) for v in tracked} == {5 * (12 + (3 if kind == "image" else 2))}
    # Summed, not averaged, across ranks (AdamW would hide a factor of world_size in the gradients; the norm does not)
    assert got["grad_norm"] == pytest.approx(float(t.grad_norm), rel=1e-5)
    # Val metrics of the exported weights computed by two ranks (each a share of uneven batches) equal to what one
    # process computes over the whole val set, to the last bit.
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


@pytest.mark.parametrize("world", [2, 3])
def test_the_ranks_micro_batches_are_those_one_process_cuts_from_the_window(world: int) -> None:
    """Rank after rank, the shares cut into micro-batches are one process's micro-batches of the window, whole or
    partial (BatchNorm's statistics are per micro-batch); `micro_batches` counts each rank's non-empty ones."""
    micro_batch, accumulate = 8, 2
    share = micro_batch * accumulate
    for n in (share * world, 1, 7, 8, 11, 16, 20, share * world - 1):
        idx = torch.arange(100, 100 + n)
        one_process = [piece.tolist() for piece in idx.split(micro_batch)]
        groups = [distributed.Group(rank=r, world_size=world) for r in range(world)]
        per_rank = [[piece.tolist() for piece in g.shard(idx, share).split(micro_batch) if len(piece)] for g in groups]
        assert [piece for pieces in per_rank for piece in pieces] == one_process, n
        assert all(len(pieces) <= accumulate for pieces in per_rank), n
        assert groups[0].micro_batches(n, share, micro_batch) == [len(pieces) for pieces in per_rank], n


def forked(fn: Callable[..., None], world: int, *args: Any, limit: float = 60) -> list[int | None]:
    """`fn(rank, *args)` on `world` processes forked from this one, with torch and what DDP imports already loaded (no
    seconds of start-up per rank); each one's exit code, in rank order. A rank still running after `limit` seconds
    gets SIGABRT: faulthandler's handler prints its threads' stacks (it needs no GIL) and it exits with -6."""
    import torch._dynamo  # noqa: F401  # DDP's constructor imports it: seconds, paid here once
    import torch.distributed as dist

    assert not dist.is_initialized()  # a forked rank must start with no group of this process's
    fork = multiprocessing.get_context("fork")
    ranks = [fork.Process(target=_forked_rank, args=(fn, rank, *args)) for rank in range(world)]
    for rank in ranks:
        rank.start()
    deadline = time.monotonic() + limit
    for rank in ranks:
        rank.join(max(deadline - time.monotonic(), 0))
    for rank in ranks:
        if rank.is_alive() and rank.pid is not None:
            os.kill(rank.pid, signal.SIGABRT)
            rank.join(10)
            if rank.is_alive():
                rank.kill()
                rank.join()
    return [rank.exitcode for rank in ranks]


def _forked_rank(fn: Callable[..., None], rank: int, *args: Any) -> None:
    faulthandler.enable()  # SIGABRT prints the stacks (never dump_traceback_later here: see tests/timeout_backstop.py)
    gc.freeze()  # the collector skips what this process inherited: a collection costs this rank's objects only
    fn(rank, *args)


def test_the_ddp_gradient_hook_sums_each_bucket_asynchronously(tmp_path: Path) -> None:
    """Two ranks, each a backward through DDP on its half of a batch: after the comm hook, each holds the sum of the
    two halves' gradients (computed here, one half at a time), to the last bit; DDP's default would average them."""
    assert forked(dist_ranks.gradient_sum, 2, str(tmp_path)) == [0, 0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks ran: the same kernels
    try:
        want: dict[str, torch.Tensor] = {}
        for half in dist_ranks.halves():
            torch.manual_seed(0)
            alone = torch.nn.Linear(3, 2)
            alone(half).square().sum().backward()
            for name, p in alone.named_parameters():
                assert p.grad is not None
                want[name] = want[name] + p.grad if name in want else p.grad
    finally:
        torch.set_num_threads(threads)
    for rank in range(2):
        got = torch.load(tmp_path / f"grads-{rank}.pt")
        assert sorted(got) == sorted(want)
        assert all(torch.equal(got[name], want[name]) for name in want), rank


def test_a_group_shut_down_while_gloo_still_reduces_ends(tmp_path: Path) -> None:
    """Rank 0 frees its group (and the DDP model) while gloo's worker has yet to finish the comm hook's all-reduce (the
    peer joins 0.5 s late) and then run its Python callback: the process ends, it does not hang at teardown."""
    assert forked(dist_ranks.teardown_while_reducing, 2, str(tmp_path / "store"), 0.5, limit=30) == [0, 0]


@pytest.mark.parametrize("pair", [0, 1])
def test_twenty_ddp_trainings_in_a_row_each_end(tmp_path: Path, pair: int) -> None:
    """Two ranks, twenty times over: join a group, wrap a model in DDP, train a step, shut the group down and free the
    model, as a training run ends. Each teardown right after a backward, when gloo's workers may still need the GIL
    to drop the last all-reduce, which holds that backward's Python context."""
    assert forked(dist_ranks.build_step_teardown, 2, str(tmp_path / "store"), 20, limit=30) == [0, 0]


def test_sync_batchnorm_needs_cuda_and_keeps_batchnorms_state(tmp_path: Path) -> None:
    """torch runs SyncBatchNorm on CUDA only: several ranks on the CPU with train.sync_batchnorm stop before training,
    naming the field. Converted layers keep BatchNorm's state keys, so a checkpoint or an export from either setting
    loads into the plain model."""
    two = distributed.Group(rank=0, world_size=2)
    with pytest.raises(ParamsError) as caught:
        make_trainer(tmp_path, dist_ranks.model("image"), group=two, sync_batchnorm=True, **BY_KIND["image"])
    assert [path for path, _ in caught.value.problems] == ["train.sync_batchnorm"]
    assert "CUDA only" in str(caught.value)
    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(dist_ranks.model("image"))
    assert sum(isinstance(m, torch.nn.SyncBatchNorm) for m in synced.modules()) == 6
    plain = dist_ranks.model("image")
    assert_same_tensors(synced.state_dict(), plain.state_dict(), "sync_batchnorm")
    plain.load_state_dict(synced.state_dict())  # strict: the same keys


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
@pytest.mark.parametrize(
    ("before", "after", "memmap"),
    [(2, 1, False), (1, 2, False), (2, 1, True), (2, 1, "blocks"), (2, 1, "images")],
    ids=["2-1", "1-2", "2-1-streamed", "2-1-streamed-blocks", "2-1-streamed-images"],
)
def test_resume_on_another_number_of_processes_keeps_every_epochs_samples(
    tmp_path: Path, before: int, after: int, memmap: bool | str
) -> None:
    """Stop after 9 updates (mid-epoch 2: with one process at a window boundary the two-process run does not have),
    resume with the other world size: every epoch trains on each of its samples exactly once. `streamed`: the train
    split read from its files as when it exceeds data.memory_budget_mb (issue 26): a table's .npy rows, or images
    read by offset from one file and decoded in a background thread."""
    ckpt = tmp_path / "ckpt"
    first = {**SETTINGS, "max_steps": 9}
    then = {**SETTINGS, "resume": str(ckpt)}
    runs: list[list[tuple[int, int]]] = []  # what each process saw, in the order it trained on it
    for world, settings in ((before, first), (after, then)):
        if world == 1:
            runs.append(dist_ranks.run_recording(str(ckpt), settings, None, memmap))
        else:
            runs += distributed.launch(2, dist_ranks.samples_seen, str(ckpt), settings, "ddp", memmap)
    per_epoch = epochs_of([p for run in runs for p in run])
    assert sorted(per_epoch) == [0, 1, 2, 3]
    for epoch, counts in per_epoch.items():
        assert counts == Counter(range(203)), f"epoch {epoch}: repeated {[i for i, c in counts.items() if c > 1]}"
        order = (block_order if memmap == "blocks" else epoch_order)(203, 7, epoch)
        position = {i: k for k, i in enumerate(order.tolist())}
        for run in runs:  # each process walks the epoch's own order forward
            mine = [position[i] for e, i in run if e == epoch]
            assert mine == sorted(mine)


def test_the_distributed_backend_auto_is_nccl_on_cuda_and_gloo_on_cpu() -> None:
    import torch

    from trainflow.engine.distributed import backend_for

    assert backend_for("auto", torch.device("cuda", 0)) == "nccl"  # a device object needs no GPU to exist
    assert backend_for("auto", torch.device("cpu")) == "gloo"
    assert backend_for("gloo", torch.device("cuda", 0)) == "gloo"  # asked for: kept
