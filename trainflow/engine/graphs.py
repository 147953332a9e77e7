"""train.compile: the model through torch.compile, and with `reduce-overhead` its forward and backward replayed as CUDA
graphs, so the host launches two graphs per micro-batch instead of each of their kernels.

Only the model's forward and backward are graphed (torch.compile's mode="reduce-overhead": inductor's CUDA graph
trees). The rest of `Trainer.train_step` stays eager and as it was: the loss, clipping, the skip decision on the device,
the fused optimizer step, the counters and the schedule, a few dozen small kernels whose launches never wait for the
device. On CPU inductor skips CUDA graphs silently (it counts them in torch._dynamo.utils.counters["inductor"]
["cudagraph_skips"]), so the same code path runs with the capture off. TORCH_LOGS=cudagraphs names any graph that
inductor declines to capture on CUDA (one that mutates an input that is not a parameter or buffer, say).

One static graph per input shape (dynamic=False), and on CUDA one CUDA graph per shape: a table's full micro-batch, the
last window's smaller ones and the evaluation batches, each recorded once. A shape then always runs the same kernels,
whatever shapes came before it; with torch's automatic dynamic shapes, the first smaller batch would move every later
shape onto a dynamic graph, so a run resumed from before that batch would run other kernels than the uninterrupted run
for a while. Static graphs keep a resume under train.deterministic bitwise. Dynamo's recompile limit (8 graphs,
torch._dynamo.config.recompile_limit) bounds the count: a shape past it runs eagerly, with torch's warning.

Where reduce-overhead is not what runs:
- refused, with a ParamsError on train.compile (`refusals`), when params.yaml asks for something else that cannot be
  had with it on any machine: train.profile (torch.profiler does not record the kernels of a CUDA graph replay
  faithfully, and has crashed on them);
- compiled as with `compile: true`, with one line on stderr (`fallback_reason`), when the machine or the data decide,
  so the same params.yaml still runs captured where it can: several ranks (DDP/FSDP: untested with graphs), and text
  whose micro-batches take many shapes (padded to each batch's longest sequence, or packed).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from trainflow.engine.loaders import Dataset, TextData
from trainflow.params import TrainParams

REDUCE_OVERHEAD = "reduce-overhead"


def compiled(module: nn.Module, mode: bool | str) -> Callable[..., torch.Tensor]:
    """`module` as train.compile asks: itself (false), torch.compile's default (true), or reduce-overhead's."""
    if mode == REDUCE_OVERHEAD:
        return torch.compile(module, mode=REDUCE_OVERHEAD, dynamic=False)
    return torch.compile(module) if mode else module


def refusals(p: TrainParams) -> list[tuple[str, str]]:
    """The problems (field, what to do) of params that reduce-overhead cannot run with, on any machine."""
    if p.compile != REDUCE_OVERHEAD:
        return []
    problems = []
    if p.profile is not None:
        problems.append(
            ("train.compile", "reduce-overhead replays CUDA graphs, whose kernels torch.profiler does not record "
             "faithfully (and has crashed on); to profile a run, set train.compile: true for it, or train.profile: "
             "null to keep reduce-overhead")
        )  # fmt: skip
    return problems


def fallback_reason(world_size: int, data: Dataset) -> str | None:
    """Why reduce-overhead compiles as `compile: true` for these ranks and this training data; None: it does not."""
    if world_size > 1:
        return (
            f"with {world_size} ranks the gradients are reduced across them (DDP/FSDP), which runs with CUDA graphs "
            "untested here"
        )
    if isinstance(data, TextData) and (data.pack_width is not None or int(data.lengths.min()) < data.lengths.max()):
        return (
            "text batches are padded to their longest sequence (or packed), so nearly every batch has a shape of its "
            "own, and each shape would compile and record a graph"
        )
    return None


def own_gradients(waiting: list[nn.Parameter]) -> list[nn.Parameter]:
    """Copy each gradient that the last backward handed to a parameter of `waiting` (parameters whose .grad was None)
    out of the CUDA graph pool; returns the parameters still without a gradient. Called between the micro-batches of a
    window under reduce-overhead: after all but the last one.

    Autograd gives a parameter whose .grad is None the backward's output tensor itself (it steals it rather than copy
    it). Under reduce-overhead that tensor is the backward graph's output, in the memory pool that the next
    micro-batch's replay reuses: the next backward would add into memory that the replay has overwritten (torch
    marks such a tensor and raises when it is read). A copy of each, once per window, is what accumulation costs; a
    window of one micro-batch costs nothing (clipping and the step read its gradients before the next replay). Not
    torch's other advice, zeroed .grad buffers allocated up front: a parameter that gets no gradient must keep .grad
    None, so that the optimizer leaves it alone, as the eager step does.
    """
    for q in waiting:
        if q.grad is not None:
            q.grad = q.grad.clone()
    return [q for q in waiting if q.grad is None]
