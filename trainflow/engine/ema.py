"""An exponential moving average of the weights (train.ema_decay).

ema = decay * ema + (1 - decay) * weights after each *applied* update, as ema += (1 - decay) * (weights - ema): three
foreach kernels over all parameters. On the device path a skipped update moves the averages by 0 * (weights - ema),
which leaves each as it was (x + 0 * d = x for finite d, and a skipped update leaves the weights finite), so the host
never has to know whether the update was applied. Buffers (BatchNorm's running statistics) are not averaged:
the model's own are used with the averaged parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class EMA:
    def __init__(self, named: list[tuple[str, nn.Parameter]], decay: float, device: torch.device) -> None:
        self.names = [n for n, _ in named]
        self.targets = [q.detach() for _, q in named]  # views of the parameters: the optimizer updates them in place
        self.shadow = [t.clone() for t in self.targets]  # the averages start at the initial weights
        self.weight = torch.tensor(1.0 - decay, device=device)  # how far an applied update moves the average
        self._masked = torch.zeros((), device=device)

    def update(self) -> None:
        """After an applied update (the host path: it knows)."""
        self._move(self.weight)

    def update_if(self, is_finite: torch.Tensor) -> None:
        """After a possibly skipped update (the device path): moves the averages only if `is_finite`, without a sync."""
        self._move(torch.mul(is_finite, self.weight, out=self._masked))

    def _move(self, weight: torch.Tensor) -> None:
        # ema += weight * (weights - ema). Not torch.lerp: its foreach form reads a tensor weight on the host.
        step = torch._foreach_sub(self.targets, self.shadow)
        torch._foreach_mul_(step, weight)
        torch._foreach_add_(self.shadow, step)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block (to evaluate them), its own again after it."""
        backup = [t.clone() for t in self.targets]
        torch._foreach_copy_(self.targets, self.shadow)
        try:
            yield
        finally:
            torch._foreach_copy_(self.targets, backup)

    def state(self) -> dict[str, torch.Tensor]:
        """The averages by parameter name (the tensors themselves: a checkpoint snapshots what it saves)."""
        return dict(zip(self.names, self.shadow, strict=True))

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        missing = sorted(set(self.names) - set(tensors))
        if missing:
            raise KeyError(f"the checkpoint's EMA has no {', '.join(missing[:5])}")
        torch._foreach_copy_(self.shadow, [tensors[n].to(t.device) for n, t in zip(self.names, self.shadow)])

    @staticmethod
    def overlay(
        model: nn.Module, weights: dict[str, torch.Tensor], average: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """`weights` (a state dict of `model`) with each trainable parameter's `average` (as `state()` gives them) in
        its place; a parameter tied under several names gets its average under each."""
        by_id = {id(q): n for n, q in model.named_parameters()}  # the deduplicated names, as `names` holds them
        out = dict(weights)
        for name, q in model.named_parameters(remove_duplicate=False):
            first = by_id.get(id(q))
            if first in average and name in out:
                out[name] = average[first].detach().to(out[name].device, copy=True)
        return out
