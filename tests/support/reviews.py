"""A generated sentiment task for the text models (tiny BERT and the like): review-like sentences and their labels."""

from __future__ import annotations

import numpy as np
import pandas as pd

POSITIVE = ["good", "great", "fine", "lovely", "superb"]
NEGATIVE = ["bad", "awful", "poor", "boring", "dull"]
FILLER = ["the", "a", "movie", "was", "plot", "actor", "i", "it", "this", "film", "and", "very"]


def reviews(n: int, seed: int = 0) -> pd.DataFrame:
    """Half positive, half negative: a few sentiment words among filler (some of the other side's, as noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = "pos" if i % 2 == 0 else "neg"
        words = list(rng.choice(FILLER, size=rng.integers(3, 8)))
        words += list(rng.choice(POSITIVE if label == "pos" else NEGATIVE, size=2))
        if rng.random() < 0.3:
            words.append(str(rng.choice(NEGATIVE if label == "pos" else POSITIVE)))
        rng.shuffle(words)
        rows.append((" ".join(words) + ".", label))
    return pd.DataFrame(rows, columns=["text", "label"])
