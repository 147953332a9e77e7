"""TensorBoard's event files read back, as TensorBoard reads them."""

from __future__ import annotations

from pathlib import Path


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files of `folder`, as TensorBoard reads them: {tag: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point, no sampling
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
