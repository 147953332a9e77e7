"""Crash-safe, pickle-free checkpoints: a directory of safetensors files plus meta.json.

Written to a temp directory, fsynced, then renamed into place, so a reader sees either the old checkpoint or the new
one, never half of one. Loading only parses safetensors and JSON; it never unpickles or executes anything.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from trainflow.errors import UserError
from trainflow.io import atomic_dir, read_json

META = "meta.json"
ALLOWED_SUFFIXES = (".safetensors", ".json")


class CheckpointError(UserError):
    """A checkpoint directory that is incomplete, corrupt, or holds files we refuse to load."""


@dataclass
class Checkpoint:
    tensors: dict[str, dict[str, torch.Tensor]]  # group name (model, optimizer, rng) -> flat tensor dict
    meta: dict[str, Any]


def save_checkpoint(dest: Path, tensors: dict[str, dict[str, torch.Tensor]], meta: dict[str, Any]) -> None:
    import json

    with atomic_dir(dest) as tmp:
        for group, flat in tensors.items():
            save_file({k: v.detach().cpu().contiguous() for k, v in flat.items()}, str(tmp / f"{group}.safetensors"))
        meta = {**meta, "tensor_groups": sorted(tensors)}
        (tmp / META).write_text(json.dumps(meta, indent=1, sort_keys=True))


def load_checkpoint(path: Path) -> Checkpoint:
    if not (path / META).is_file():
        raise CheckpointError(f"checkpoint {path}: no {META}; it is incomplete or not a trainflow checkpoint")
    for f in path.iterdir():
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
            raise CheckpointError(f"checkpoint {path}: tensor file {file.name} is missing or corrupt ({exc})") from None
    return Checkpoint(tensors, meta)


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
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        pid, key = name.split("/", 1)
        state.setdefault(int(pid), {})[key] = value
    for pid, values in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(values)
    return {"state": state, "param_groups": meta["param_groups"]}


# --- RNG states ------------------------------------------------------------------------------------------------------


def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda{i}"] = s
    py_version, py_state, py_gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    meta = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
    }
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("cuda")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, state, gauss = meta["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
