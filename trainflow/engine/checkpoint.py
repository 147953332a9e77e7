"""Crash-safe, pickle-free checkpoints: a directory of safetensors files plus meta.json.

Each checkpoint is written to a temp directory, fsynced, then renamed to `step-<update>` — a name that did not exist,
so the rename is atomic and a reader sees a whole checkpoint or none. Nothing is ever overwritten in place. "last" is
the newest step directory; "best" is named by `best.json` and by the meta of every later checkpoint. The one
exception to "never overwritten": when an evaluation after a checkpoint was written finds that update's weights the
best (the final evaluation), that checkpoint's meta.json is replaced, atomically, by one that says so. Loading only
parses safetensors and JSON; it never unpickles or executes anything.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from trainflow.core.errors import DiskFullError, UserError
from trainflow.core.io import atomic_dir, failpoint, read_json, write_json

META = "meta.json"
BEST = "best.json"
STEP_DIR = re.compile(r"^step-(\d{9})$")
ALLOWED_SUFFIXES = (".safetensors", ".json")


class CheckpointError(UserError):
    """A checkpoint directory that is incomplete, corrupt, or holds files we refuse to load."""


@dataclass
class Checkpoint:
    tensors: dict[str, dict[str, torch.Tensor]]  # group name (model, optimizer, rng) -> flat tensor dict
    meta: dict[str, Any]


def save_checkpoint(dest: Path, tensors: dict[str, dict[str, torch.Tensor]], meta: dict[str, Any]) -> None:
    with atomic_dir(dest) as tmp:
        for i, (group, flat) in enumerate(sorted(tensors.items())):
            save_file({k: v.detach().cpu().contiguous() for k, v in flat.items()}, str(tmp / f"{group}.safetensors"))
            if i == 0:
                failpoint("checkpoint_write")
        meta = {**meta, "tensor_groups": sorted(tensors)}
        (tmp / META).write_text(json.dumps(meta, indent=1, sort_keys=True))


def repair(path: Path) -> str:
    """What to do about a checkpoint that cannot be used."""
    return (
        f"delete it (`rm -r {path}`: training resumes from the checkpoint before it, if there is one) or start fresh "
        "with train.resume: never"
    )


def load_checkpoint(path: Path) -> Checkpoint:
    if not (path / META).is_file():
        raise CheckpointError(f"checkpoint {path}: no {META}; it is incomplete or not a trainflow checkpoint")
    for f in path.iterdir():
        if f.name.startswith(".") and f.suffix == ".tmp":
            continue  # what a killed meta.json rewrite left (io.atomic_path's temp file): never read
        if f.suffix not in ALLOWED_SUFFIXES:
            raise CheckpointError(
                f"checkpoint {path}: refusing to load because it holds {f.name!r}; trainflow checkpoints contain "
                "only .safetensors and .json files, and a pickle file can run arbitrary code when loaded"
            )
    meta = read_json(path / META)
    tensors = {}
    for group in meta.get("tensor_groups", []):
        file = path / f"{group}.safetensors"
        try:
            tensors[group] = load_file(str(file))
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CheckpointError(
                f"checkpoint {path}: tensor file {file.name} is missing or corrupt ({exc}); {repair(path)}"
            ) from None
    return Checkpoint(tensors, meta)


class CheckpointStore:
    """The checkpoints of one training run: `step-<update>` directories, `best.json`, keep-last-k retention."""

    def __init__(self, root: Path, keep_last: int) -> None:
        self.root = root
        self.keep_last = keep_last
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None

    def steps(self) -> list[Path]:
        """Complete checkpoints, oldest first. A half-written one is still a hidden temp dir and is not listed."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
        return sorted(found, key=lambda p: p.name)

    def latest(self) -> Path | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def best(self) -> Path | None:
        if not (self.root / BEST).is_file():
            return None
        path = self.root / str(read_json(self.root / BEST)["step"])
        return path if path.is_dir() else None

    def path(self, update: int) -> Path:
        return self.root / f"step-{update:09d}"

    def save(self, update: int, tensors: dict[str, dict[str, torch.Tensor]], meta: dict[str, Any]) -> Path:
        """Write checkpoint `update`; then point best.json at meta["best_step"] and drop old periodic checkpoints."""
        dest = self.path(update)
        save_checkpoint(dest, tensors, meta)
        if meta.get("best_step"):
            write_json(self.root / BEST, {"step": meta["best_step"]})
        self.prune(keep={dest.name, str(meta.get("best_step"))})
        return dest

    def name_best(self, update: int, changes: dict[str, Any]) -> None:
        """Make checkpoint `update`, written before an evaluation found its weights the best, say so: its meta.json
        gets `changes` (the state after that evaluation) and names itself best (an atomic rewrite), and best.json
        names it. Its tensors are untouched: they are the weights that evaluation scored."""
        self.wait()
        path = self.path(update)
        meta = read_json(path / META)
        write_json(path / META, {**meta, **changes, "best_step": path.name})
        write_json(self.root / BEST, {"step": path.name})
        self.prune(keep={path.name})  # the best before it is one no longer

    def save_async(
        self, update: int, tensors: dict[str, dict[str, torch.Tensor]], meta: dict[str, Any]
    ) -> dict[str, dict[str, torch.Tensor]]:
        """Snapshot the tensors now (training goes on changing them), write them in a background thread.

        At most one write is in flight: this waits for the previous one. The serialising and fsyncing overlap with
        training; the snapshot itself is one copy of the state into host memory, and is returned.
        """
        self.wait()
        snapshot = {g: {k: v.detach().to("cpu", copy=True) for k, v in flat.items()} for g, flat in tensors.items()}

        def write() -> None:
            try:
                self.save(update, snapshot, meta)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the training thread by wait()
                self._error = exc

        self._writer = threading.Thread(target=write, name=f"checkpoint-{update}", daemon=False)
        self._writer.start()
        return snapshot

    def wait(self) -> None:
        """Block until the write in flight is on disk; raise its error, if it had one."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, DiskFullError):
                latest = self.latest()
                resume = (
                    f"The last complete checkpoint, {latest}, is intact: a rerun resumes from it." if latest else ""
                )
                raise DiskFullError(f"{error} {resume}".strip()) from error
            raise CheckpointError(f"writing a checkpoint in {self.root} failed: {error}") from error

    def prune(self, keep: set[str]) -> None:
        """Keep the newest `keep_last` checkpoints and those named in `keep` (last and best); delete the rest."""
        steps = self.steps()
        keep = keep | {p.name for p in steps[-self.keep_last :]}
        for p in steps:
            if p.name not in keep:
                shutil.rmtree(p, ignore_errors=True)

    def remove_partial(self) -> None:
        """Delete temp files and dirs that a killed write left behind (hidden, so never mistaken for checkpoints)."""
        if self.root.is_dir():
            for p in self.root.glob(".*.tmp"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()

    def clear(self) -> int:
        """Remove every checkpoint and leftover temp dir (a fresh start); returns how many checkpoints there were."""
        n = len(self.steps())
        if self.root.is_dir():
            for p in self.root.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        return n


# --- optimizer state <-> (flat tensors, JSON) --------------------------------------------------------------------


def flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, per_param in state["state"].items():
        for key, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"{pid}/{key}"] = value
            else:
                scalars.setdefault(str(pid), {})[key] = value
    # A tensor learning rate (the trainer's device-side schedule) is stored as its value.
    groups = [{k: v.item() if torch.is_tensor(v) else v for k, v in g.items()} for g in state["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        pid, key = name.split("/", 1)
        state.setdefault(int(pid), {})[key] = value
    for pid, values in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(values)
    return {"state": state, "param_groups": meta["param_groups"], "param_names": meta.get("param_names")}


# --- RNG states ------------------------------------------------------------------------------------------------------


def _cuda_generators() -> Sequence[torch.Generator]:
    """The default random generator of each visible CUDA device, in device order (none without CUDA): the objects
    torch.cuda.get_rng_state / set_rng_state read and write."""
    if not torch.cuda.is_available():
        return ()
    torch.cuda.init()  # default_generators is filled in when CUDA initialises
    return torch.cuda.default_generators


def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch": torch.get_rng_state()}
    tensors |= {f"cuda{i}": g.get_state() for i, g in enumerate(_cuda_generators())}
    py_version, py_state, py_gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    meta = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
    }
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any], *, reseed: int) -> list[int]:
    """Put back the random streams `capture_rng` captured. CUDA device i gets the state saved as `cuda<i>` (matched by
    number: `cuda10` is device 10, not the third in text order). A device the checkpoint has no state for (it was
    written with fewer GPUs, or on a CPU) is seeded with `reseed + i` instead; states of devices this machine lacks
    are not needed by it and are left out. Returns the devices that were re-seeded."""
    torch.set_rng_state(tensors["torch"])
    saved = {int(k.removeprefix("cuda")): v for k, v in tensors.items() if re.fullmatch(r"cuda\d+", k)}
    reseeded = []
    for i, generator in enumerate(_cuda_generators()):
        if i in saved:
            generator.set_state(saved[i])
        else:
            generator.manual_seed(reseed + i)
            reseeded.append(i)
    version, state, gauss = meta["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    return reseeded
