"""The optimizer and its parameter groups.

Groups come from three rules, applied per parameter: weight decay only on matrices (not biases and norm weights), the
first `train.param_groups` rule whose glob matches the parameter's name (its lr_scale and weight decay), and
`train.layer_decay` (layer l of L learns at layer_decay**(L + 1 - l) times the rate). Parameters with the same
(rule, layer, weight decay) share a group. There is still one schedule: each group's rate is the scheduled rate times
its fixed `lr_scale`, read from one table row per update (see `Trainer._build_table`), so the device-side step costs
one index_select however many groups there are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, cast

import torch
from torch import nn

from trainflow.core.errors import ParamsError
from trainflow.params import TrainParams


@dataclass
class GroupSpec:
    name: str  # e.g. "layer3.decay", "rule0.no_decay": what the per-group rates are logged as (lr/<name>)
    lr_scale: float
    weight_decay: float
    params: list[nn.Parameter] = field(default_factory=list)


def plan_groups(model: nn.Module, p: TrainParams) -> list[GroupSpec]:
    """The model's trainable parameters in groups, in the order their first parameter appears in the model."""
    named = [(n, q) for n, q in model.named_parameters() if q.requires_grad]
    layer_of = getattr(model, "layer_of", None) if p.layer_decay is not None else None
    n_layers: int = getattr(model, "num_layers", 0)
    if p.layer_decay is not None and (layer_of is None or not n_layers):
        raise ParamsError(
            "params.yaml",
            [("train.layer_decay", f"{type(model).__name__} has no numbered layers to decay (text_transformer "
              "and hf: models have); set it to null, or give layers their own rates with train.param_groups")],
        )  # fmt: skip
    rules = p.param_groups
    used = [False] * len(rules)
    groups: dict[tuple[int, int, float], GroupSpec] = {}
    for name, q in named:
        index = next((i for i, r in enumerate(rules) if fnmatchcase(name, r.match)), -1)
        rule = rules[index] if index >= 0 else None
        wd = p.weight_decay if q.ndim >= 2 else 0.0
        if rule is not None and rule.weight_decay is not None:
            wd = rule.weight_decay
        scale, layer = rule.lr_scale if rule is not None else 1.0, -1
        if layer_of is not None:
            layer = int(layer_of(name))
            scale *= p.layer_decay ** (n_layers + 1 - layer)  # type: ignore[operator]
        if index >= 0:
            used[index] = True
        key = (index, layer, wd)
        if key not in groups:
            parts = ([f"rule{index}"] if index >= 0 else []) + ([f"layer{layer}"] if layer >= 0 else [])
            groups[key] = GroupSpec(".".join([*parts, "decay" if wd else "no_decay"]), scale, wd)
        groups[key].params.append(q)
    unused = [i for i in range(len(rules)) if not used[i]]
    if unused:
        names = [n for n, _ in named]
        shown = ", ".join(names[:40]) + (f", ... ({len(names)} in all)" if len(names) > 40 else "")
        problems = [(f"train.param_groups[{i}].match", f"{rules[i].match!r} matches no parameter; names: {shown}")
                    for i in unused]  # fmt: skip
        raise ParamsError("params.yaml", problems)
    return list(groups.values())


def build_optimizer(specs: list[GroupSpec], p: TrainParams, lrs: torch.Tensor) -> torch.optim.Optimizer:
    """AdamW or SGD with momentum, fused, one parameter group per spec, whose learning rate is the device tensor
    `lrs[g]` (a view: the trainer writes every group's rate with one op).

    Every parameter gets its optimizer state here, before the first update (`init_state`)."""
    groups = [
        {"params": s.params, "lr": lrs[g], "weight_decay": s.weight_decay, "name": s.name, "lr_scale": s.lr_scale}
        for g, s in enumerate(specs)
    ]
    # fused=True: one kernel for all parameters, and it accepts `found_inf` to skip an update without a host sync.
    optimizer: torch.optim.Optimizer
    if p.optimizer == "sgd":
        optimizer = torch.optim.SGD(groups, lr=lrs[0], momentum=p.momentum, fused=True)
    else:
        optimizer = torch.optim.AdamW(groups, lr=lrs[0], fused=True)
    init_state(optimizer)
    return optimizer


def init_state(optimizer: torch.optim.Optimizer) -> None:
    """Create each parameter's optimizer state now, as the optimizer's first update would.

    The fused kernels honour `found_inf` by not writing anything, but the optimizer allocates state before the kernel
    runs: a skipped *first* SGD update leaves a momentum buffer of uninitialised memory (`empty_like`) that the next
    update reads. With the state in place, no update is a first one, so a skipped update changes no state tensor.
    Zero state is the first update exactly: SGD's buf = momentum * 0 + grad = grad (no dampening); AdamW's moments and
    step count start at zero.
    """
    for group in optimizer.param_groups:
        for q in group["params"]:
            state = optimizer.state[q]
            if state:
                continue
            if isinstance(optimizer, torch.optim.SGD):
                if group["momentum"]:
                    state["momentum_buffer"] = torch.zeros_like(q, memory_format=torch.preserve_format)
            elif isinstance(optimizer, torch.optim.AdamW):
                state["step"] = torch.zeros((), dtype=torch.float32, device=q.device)  # fused: a float32 tensor
                state["exp_avg"] = torch.zeros_like(q, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(q, memory_format=torch.preserve_format)
            else:
                raise TypeError(f"init_state does not know the state of {type(optimizer).__name__}")


class FusedAdamWStep:
    """AdamW's update exactly as `torch.optim.AdamW(fused=True).step()` makes it, without the Python that surrounds
    the kernel there on every step.

    torch's step runs hooks and a profiler record, looks up each parameter's state, checks its gradient, and groups
    the tensors by device and dtype, then calls one `torch._fused_adamw_` per group: tens of microseconds of host time
    per update, which a small model's update pays in full (bench/engine_overhead.py measured it against the rest of the
    step). Here the tensor lists are built once and the same kernel runs on the same tensors: the optimizer's own state,
    updated in place (its state_dict, checkpoints and resume are unchanged), each group's `lr` tensor, the step
    counts incremented before the kernel and, where `found_inf` skips the update, decremented after it, as torch does.

    `applies(optimizer)` says where that holds: AdamW with one device and dtype per group and none of amsgrad,
    maximize, capturable or differentiable; elsewhere the trainer calls the optimizer's own step. After the optimizer's
    state is replaced (a resume), `refresh()` rebuilds the lists; a step also rebuilds them when it finds another
    state dict."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._state: object = None
        self._groups: list[tuple[dict[str, Any], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
                                 list[torch.Tensor]]] = []  # fmt: skip

    @staticmethod
    def applies(optimizer: torch.optim.Optimizer) -> bool:
        if type(optimizer) is not torch.optim.AdamW:
            return False
        for group in optimizer.param_groups:
            if not group.get("fused") or any(group.get(k) for k in ("amsgrad", "maximize", "capturable")):
                return False
            if group.get("differentiable") or len({(q.device, q.dtype) for q in group["params"]}) > 1:
                return False
        return True

    def refresh(self) -> None:
        """The parameters and state tensors of each group, from the optimizer as it is now (state a parameter lacks is
        created as the first update would create it: `init_state`)."""
        opt = self.optimizer
        init_state(opt)
        self._state = opt.state
        self._groups = []
        for group in opt.param_groups:
            params = list(group["params"])
            states = [opt.state[q] for q in params]
            self._groups.append((group, params, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                                 [s["step"] for s in states]))  # fmt: skip

    @torch.no_grad()
    def __call__(self, found_inf: torch.Tensor | None = None) -> None:
        if self.optimizer.state is not self._state:
            self.refresh()
        for group, params, exp_avgs, exp_avg_sqs, steps in self._groups:
            grads = cast(list[torch.Tensor], [q.grad for q in params])
            if any(g is None for g in grads):  # as torch: a parameter without a gradient is not stepped at all
                keep = [i for i, g in enumerate(grads) if g is not None]
                params, grads, exp_avgs, exp_avg_sqs, steps = (
                    [xs[i] for i in keep] for xs in (params, grads, exp_avgs, exp_avg_sqs, steps)
                )
            if not params:
                continue
            beta1, beta2 = group["betas"]
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(
                params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"], beta1=beta1,
                beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"], maximize=False, grad_scale=None,
                found_inf=found_inf,
            )  # fmt: skip
            if found_inf is not None:
                torch._foreach_sub_(steps, [found_inf] * len(steps))
