"""What each rank runs in tests/engine/test_distributed.py (module-level: the launcher starts fresh processes).

Every function takes the scenario's arguments, joins the process group the launcher set up, and returns something
plain (tensors on the CPU, numbers, lists) from rank 0 — what the other ranks saw is gathered to rank 0 first."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from engine_kit import make_trainer, mlp, table, text_data, text_model

from trainflow.engine import distributed
from trainflow.engine.augment import Augment
from trainflow.engine.loaders import Dataset, ImageData, MemmapData, RecordFile
from trainflow.engine.trainer import Trainer
from trainflow.models.cnn import CNN

CPU = torch.device("cpu")


def join(strategy: str = "ddp") -> distributed.Group:
    return distributed.init(int(os.environ["WORLD_SIZE"]), strategy, "gloo", CPU)


def data(kind: str) -> tuple[Dataset, Dataset]:
    if kind == "table":
        return table(n=203), table(n=203, seed=1)
    if kind.startswith("image"):  # the last window: 20 images (both ranks), or 11 (rank 0 alone)
        n = 116 if kind == "image" else 107
        return images(n, seed=1, augment=Augment(shift=1, flip=True)), images(40, seed=2)
    train = text_data(n=91)
    if kind == "text-packed":
        train.pack_width = 24  # the sequences are 2-18 tokens long
    return train, text_data(n=91)


def images(n: int, seed: int, augment: Augment | None = None) -> ImageData:
    """n random 2 x 6 x 5 images of 3 classes."""
    pixels = torch.randint(0, 256, (n, 2, 6, 5), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return ImageData(pixels, torch.arange(n) % 3, [128.0, 128.0], [64.0, 64.0], augment=augment)


def model(kind: str) -> torch.nn.Module:
    if kind.startswith("image"):
        torch.manual_seed(5)
        cnn = CNN(2, 3, [8, 16], 1, image_size=[6, 5])  # 6 BatchNorm layers
        norm = cnn.stem[1]
        assert isinstance(norm, torch.nn.BatchNorm2d)
        norm.momentum = None  # one keeps a cumulative average, the others torch's moving one (momentum 0.1)
        return cnn
    return mlp() if kind == "table" else text_model("token")


def exactness(tmp: str, settings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """ddp and fsdp, for each data kind: the final weights, the history, where the checkpoints are, and val metrics
    computed by all ranks of the final weights."""
    out: dict[str, Any] = {}
    joined = join()  # one process group for every case: a re-initialised group would reuse the launcher's store
    for strategy in ("ddp", "fsdp"):
        group = dataclasses.replace(joined, strategy=strategy)
        for kind in settings:
            train, val = data(kind)
            t = make_trainer(Path(tmp) / f"{strategy}-{kind}", model(kind), group=group, **settings[kind])
            t.fit(train, val)
            final = group.broadcast(t.final_weights)  # evaluate exactly the exported weights, on every rank
            group.load_state(t.model, None, final, None)
            metrics = t.evaluate(val, batch_size=16)  # 13 / 6 / 3 batches dealt to 2 ranks: uneven, one empty
            if kind == "table":  # val_roc_auc/val_pr_auc: every rank's scores gathered (per-token text has none)
                t.p = t.p.model_copy(update={"monitor": "val_roc_auc"})
                metrics = t.evaluate(val, batch_size=16)
            if group.is_main:
                out[f"{strategy}-{kind}"] = {
                    "weights": final,
                    "checkpoints": str(t.store.root),
                    "metrics": metrics,
                    "history": t.state.history,
                    "grad_norm": float(t.grad_norm),  # of the last update: of the summed gradients, all ranks'
                }
    distributed.shutdown(joined)
    return out


def poisoned_run(tmp: Path, group: distributed.Group | None, accumulate: int) -> Trainer:
    """A NaN in the inputs of the 4th update, on rank 1 only (on the only rank of one process)."""
    t = make_trainer(tmp, mlp(), group=group, batch_size=8, accumulate=accumulate, epochs=2)
    step, poisoned_rank = t.train_step, 1 if t.group.distributed else 0

    def poisoned(micro: list[Any], count: int) -> None:
        if t.group.rank == poisoned_rank and t.state.updates == 3:
            micro = [type(b)({"x": b.inputs["x"] * torch.nan}, b.target, b.count) for b in micro]
        step(micro, count)

    t.train_step = poisoned  # type: ignore[method-assign]
    t.fit(table(n=203), table(n=203, seed=1))
    return t


def nonfinite_on_rank_1(tmp: str, strategy: str) -> dict[str, Any]:
    """Every rank's counts and the hash of the weights it holds (its shard, with fsdp); rank 0's final weights."""
    group = join(strategy)
    t = poisoned_run(Path(tmp) / strategy, group, accumulate=2)
    local = hashlib.sha256()
    for v in t.model.state_dict().values():
        local.update(group.local(v).detach().contiguous().view(torch.uint8).numpy().tobytes())
    seen = {"rank": group.rank, "updates": t.state.updates, "applied": t.state.applied, "hash": local.hexdigest()}
    gathered = group.gather(seen)
    distributed.shutdown(group)
    return {"ranks": gathered, "weights": t.final_weights}


def samples_seen(
    tmp: str, settings: dict[str, Any], strategy: str = "ddp", memmap: bool | str = False
) -> list[list[tuple[int, int]]]:
    """Train (resuming from what `tmp` holds) and return, from every rank, the (epoch, sample) pairs it trained on."""
    group = join(strategy)
    seen = run_recording(tmp, settings, group, memmap)
    gathered = group.gather(seen)
    distributed.shutdown(group)
    return gathered or []


def run_recording(
    tmp: str, settings: dict[str, Any], group: distributed.Group | None = None, memmap: bool | str = False
) -> list[tuple[int, int]]:
    """`memmap`: the train split as the streamed path holds it (data.memory_budget_mb exceeded): True, a table in .npy
    files that every rank memory-maps whole, as trainflow.data.stream writes them; "images", 203 images whose bytes
    lie back to back in one file, read by offset (RecordFile) and decoded in the background, as the train stage's
    `streamed_images` holds them (raw pixels here: what decoding makes of PNGs is not what this test is about);
    "blocks", the .npy table in train.shuffle blocks' order (what a streamed table trains on by default)."""
    rank = group.rank if group is not None else 0
    files = Path(tmp).parent / f"streamed-rank{rank}"
    files.mkdir(parents=True, exist_ok=True)
    train: Dataset
    if memmap == "images":
        t = make_trainer(Path(tmp), model("image"), group=group, **settings)
        held = images(203, seed=1)  # in memory: what each sample's batch rows are, to name the sample by
        pixels = held.images.numpy() if isinstance(held.images, torch.Tensor) else None
        assert pixels is not None
        (files / "images.bin").write_bytes(pixels.tobytes())
        size = pixels[0].nbytes
        stored = RecordFile(files / "images.bin", np.arange(len(pixels) + 1, dtype=np.int64) * size)

        def decode(rows: list[int]) -> torch.Tensor:  # as Preprocessor.decode: [len(rows), C, H, W], none too
            out = np.empty((len(rows), *pixels.shape[1:]), dtype=np.uint8)
            for i, b in enumerate(stored.read(rows)):
                out[i] = np.frombuffer(b, dtype=np.uint8).reshape(pixels.shape[1:])
            return torch.from_numpy(out)

        train = ImageData(decode, held.targets, held.mean, held.std)
        rows = held.batch(torch.arange(203)).inputs["images"].numpy()
        key, val = "images", images(40, seed=2)
    else:
        t = make_trainer(Path(tmp), mlp(), group=group, **settings)
        tensors = table(n=203)
        train, rows, key, val = tensors, tensors.x.numpy(), "x", table(n=203, seed=1)
        if memmap:
            np.save(files / "x.npy", tensors.x.numpy())
            np.save(files / "y.npy", tensors.y.numpy())
            train = MemmapData(np.load(files / "x.npy", mmap_mode="r"), np.load(files / "y.npy", mmap_mode="r"))
            train.shuffle = "blocks" if memmap == "blocks" else "rows"
    seen: list[tuple[int, int]] = []
    batch = train.batch

    sample_of = {row.tobytes(): i for i, row in enumerate(rows)}  # rows are distinct random values
    assert len(sample_of) == 203

    def recording(idx: torch.Tensor) -> Any:
        got = batch(idx)  # the sample is read off the rows the data returned, not the indices asked for
        seen.extend((t.state.epoch, sample_of[row.tobytes()]) for row in got.inputs[key].cpu().numpy())
        return got

    train.batch = recording  # type: ignore[method-assign]
    t.fit(train, val)
    return seen


# --- run in processes forked from the test (torch and DDP's imports loaded); each one's exit code is the verdict ---


def gradient_sum(rank: int, out: str) -> None:
    """This rank's backward through DDP on its half of a batch (a Linear layer seeded alike on both); the gradients
    after DDP's comm hook saved as out/grads-<rank>.pt."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(f"{out}/store", 2), rank=rank, world_size=2)
    group = distributed.Group(rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ddp = group.wrap(model, CPU)
    ddp(halves()[rank]).square().sum().backward()
    torch.save({n: p.grad for n, p in model.named_parameters()}, f"{out}/grads-{rank}.pt")
    distributed.shutdown(group)


def halves() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(1))
    return x[:5], x[5:]


class Bucket:
    """What DDP hands its comm hook, as far as `_sum_hook` reads it."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer


def teardown_while_reducing(rank: int, store: str, late: float) -> None:
    """Rank 0 runs the comm hook on a bucket, shuts the group down and frees the model at once, while rank 1 joins
    that all-reduce `late` seconds later: when rank 0 frees its group, gloo's worker still has the hook's Python
    callback to run, and needs the GIL for it."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    group = distributed.Group(rank=rank, world_size=2)
    ddp = group.wrap(torch.nn.Linear(3, 2), CPU)
    if rank == 1:
        time.sleep(late)
    distributed._sum_hook(None, Bucket(torch.ones(4)))
    distributed.shutdown(group)
    del ddp
    gc.collect()  # DDP sits in a reference cycle: the collector frees it, its reducer with it


def build_step_teardown(rank: int, store: str, cycles: int) -> None:
    """`cycles` times: join a group of two, wrap an MLP in DDP, train a step, shut the group down and free the model
    (with its reducer), as a training run ends."""
    torch.set_num_threads(1)
    shared = dist.FileStore(store, 2)
    for cycle in range(cycles):
        dist.init_process_group("gloo", store=dist.PrefixStore(f"cycle{cycle}", shared), rank=rank, world_size=2)
        _step_then_teardown(distributed.Group(rank=rank, world_size=2), seed=cycle)
        gc.collect()


def _step_then_teardown(group: distributed.Group, seed: int) -> None:
    ddp = group.wrap(mlp(), CPU)
    batch = table(n=16, seed=seed + group.rank)
    torch.nn.functional.cross_entropy(ddp(batch.x), batch.y).backward()
    distributed.shutdown(group)
