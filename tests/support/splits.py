"""Tables and schemas for the split tests, and the split's seeded hash written out by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainflow.data.schema import Schema

LABELS = ["a", "b", "c", "d"]


def schema_for(frame: pd.DataFrame, features: list[str] | None = None, task: str = "classification") -> Schema:
    features = features if features is not None else [c for c in frame.columns if c not in ("id", "y")]
    classes = sorted(frame["y"].dropna().astype(str).unique().tolist()) if task == "classification" else []
    return Schema(
        source="test",
        target="y",
        task=task,  # type: ignore[arg-type]
        features=features,
        kinds=dict.fromkeys(features, "numeric"),
        classes=classes,
        n_rows=len(frame),
    )


def random_frame(n: int, n_classes: int = 3, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": rng.normal(size=n),
            "s": rng.choice(["red", "green", "blue", "cyan"], size=n).astype(object),
            "y": rng.choice(LABELS[:n_classes], size=n).astype(object),
        }
    )


def splitmix64_by_hand(key: int, seed: int) -> int:
    """The documented seeded hash in plain Python ints: splitmix64's finaliser of key XOR blake2b("...:seed")."""
    import hashlib

    word = int.from_bytes(hashlib.blake2b(f"trainflow.split:{seed}".encode(), digest_size=8).digest(), "big")
    z, mask = key ^ word, 2**64 - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)
