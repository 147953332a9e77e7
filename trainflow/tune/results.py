"""A study's results in reports/tune/: trials.csv (every trial; a failed one with its error), best_params.yaml, the
optimisation history and the parameter importances as DVC plot data (CSV) and PNGs; and `--apply`: the best params
into params.yaml."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from trainflow.core.io import atomic_path
from trainflow.plots import _figure, write_csv
from trainflow.tune import space
from trainflow.tune.study import Study

STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running", "WAITING": "waiting"}


def trial_values(s: Study, frozen: Any) -> dict[str, Any]:
    """A trial's param values as params.yaml holds them (lists back from Optuna's JSON text)."""
    dims = s.params.tune.space
    return {
        path: space.decode(dims[path], v) if dims[path].type == "categorical" else v
        for path, v in frozen.params.items()
        if path in dims
    }


def trials_frame(s: Study) -> pd.DataFrame:
    rows = []
    for t in s.trials():
        ended, began = t.datetime_complete, t.datetime_start
        seconds = (ended - began).total_seconds() if ended and began else None
        values = trial_values(s, t)
        rows.append(
            {
                "trial": t.number,
                "state": STATES.get(t.state.name, t.state.name.lower()),
                s.metric: t.value,
                "last_update": max(t.intermediate_values, default=None),
                **{path: json.dumps(v) if isinstance(v, list) else v for path, v in values.items()},
                "resumed_from_update": t.user_attrs.get("resumed_from_update"),
                "seconds": seconds,
                "mlflow_run_id": t.user_attrs.get("mlflow_run_id"),
                "error": t.user_attrs.get("error"),  # why a failed trial failed
            }
        )
    frame = pd.DataFrame(rows)
    for column in ("last_update", "resumed_from_update"):
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    return frame


def best(s: Study) -> dict[str, Any] | None:
    """The best complete trial: its number, value and params (None before one completes)."""
    done = [(float(t.value), t) for t in s.trials() if t.state.name == "COMPLETE" and t.value is not None]
    if not done:
        return None
    _, top = min(done, key=lambda vt: vt[0] if s.minimize else -vt[0])  # ties: the lower number
    return {
        "study": s.name,
        "trial": top.number,
        "metric": s.metric,
        "direction": "minimize" if s.minimize else "maximize",
        "value": top.value,
        "params": trial_values(s, top),
    }


def write(s: Study, out: Path) -> dict[str, Any] | None:
    """Write every result file; returns the best trial (as best_params.yaml holds it)."""
    frame = trials_frame(s)
    write_csv(frame, out / "trials.csv")
    top = best(s)
    if top is not None:
        with atomic_path(out / "best_params.yaml") as tmp:
            tmp.write_text(yaml.safe_dump(top, sort_keys=False))
    history = _history(frame, s)
    write_csv(history, out / "history.csv")
    _history_png(history, s, out / "optimization_history.png")
    importance = _importance(s)
    write_csv(importance, out / "importance.csv")
    _importance_png(importance, out / "param_importances.png")
    return top


def _history(frame: pd.DataFrame, s: Study) -> pd.DataFrame:
    ended = frame[frame["state"].isin(["complete", "pruned"])].copy() if len(frame) else frame
    if not len(ended):
        return pd.DataFrame(columns=["trial", "state", "value", "best"])
    values = ended[s.metric].astype(float)
    complete = values.where(ended["state"] == "complete")
    best = complete.cummin() if s.minimize else complete.cummax()
    return pd.DataFrame({"trial": ended["trial"], "state": ended["state"], "value": values, "best": best})


def _history_png(history: pd.DataFrame, s: Study, png: Path) -> None:
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4))
    for state, colour in (("complete", "tab:blue"), ("pruned", "tab:gray")):
        part = history[history["state"] == state]
        ax.scatter(part["trial"], part["value"], color=colour, label=f"{state} ({len(part)})", zorder=2)
    ax.step(history["trial"], history["best"], where="post", color="tab:red", label="best so far")
    ax.set(xlabel="trial", ylabel=s.metric, title=f"Study {s.name}: optimisation history")
    ax.legend()
    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)


def _importance(s: Study) -> pd.DataFrame:
    """fANOVA importances of the params (Optuna's default evaluator, seeded), from the complete trials."""
    import optuna

    complete = [t for t in s.trials() if t.state.name == "COMPLETE"]
    varied = {p for t in complete for p in t.params if len({json.dumps(u.params.get(p)) for u in complete}) > 1}
    alike = len({t.value for t in complete}) < 2  # every trial scored the same: fANOVA has no variance to explain
    if len(complete) < 2 or not varied or alike:
        return pd.DataFrame(columns=["param", "importance"])
    scores = optuna.importance.get_param_importances(
        s.study,
        evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
        params=sorted(varied),
    )
    return pd.DataFrame({"param": list(scores), "importance": list(scores.values())})


def _importance_png(importance: pd.DataFrame, png: Path) -> None:
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.5 * max(len(importance), 1)))
    ax.barh(importance["param"][::-1], importance["importance"][::-1], color="tab:blue")
    ax.set(xlabel="importance (fANOVA, sums to 1)", title="Parameter importances")
    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)


def apply(top: dict[str, Any], params_file: Path) -> list[str]:
    """Write the best trial's params into params.yaml (comments kept), and tags naming where they came from, which
    the register stage puts on the model version trained with them. Returns the overrides written."""
    from trainflow.params import write_overrides

    overrides = [f"{path}={json.dumps(value)}" for path, value in top["params"].items()]
    overrides += [f"register.tags.tune_study={json.dumps(top['study'])}", f"register.tags.tune_trial='{top['trial']}'"]
    write_overrides(params_file, overrides)
    return overrides
