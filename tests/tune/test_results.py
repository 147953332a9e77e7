"""A sweep's results (trainflow.tune.results): the best trial, trials.csv and best_params.yaml, the optimisation history
and its plot, the importances, and applying the best params to params.yaml. Expectations come from hand-made Optuna
studies (tests/support/sweeps.py) and values worked out by hand. The sweep code is called in this process, so that
mutation testing sees which function each test reached (tests/stages/test_tune*.py run `trainflow tune` in
subprocesses)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pandas as pd
import pytest
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from support.sweeps import LR, SIZES, ended, hand_made

from trainflow.params import load_params, write_overrides
from trainflow.tune import results

optuna.logging.set_verbosity(optuna.logging.WARNING)


# Trials 2 and 4 tie for the lowest complete value, 5 and 6 for the highest; pruned trials (Optuna gives them their
# last reported value) and trials beyond the budget hold better values than any of those, and never count.
BEST_CASE = [
    ("COMPLETE", 0.5, 0.001, [128]),
    ("PRUNED", 0.05, 0.002, [128]),
    ("COMPLETE", 0.3, 0.003, [256, 128]),
    ("FAIL", None, 0.004, [128]),
    ("COMPLETE", 0.3, 0.005, [128]),
    ("COMPLETE", 0.9, 0.006, [512, 256]),
    ("COMPLETE", 0.9, 0.007, [128]),
    ("PRUNED", 0.99, 0.008, [128]),
    ("COMPLETE", 0.01, 0.009, [128]),  # trial 8, beyond the budget of 8
    ("COMPLETE", 1.5, 0.0099, [128]),
]


@pytest.mark.parametrize(
    ("minimize", "trial", "lr", "sizes"), [(True, 2, 0.003, [256, 128]), (False, 5, 0.006, [512, 256])]
)
def test_the_best_trial_is_the_lowest_or_highest_complete_one_within_the_budget_and_the_first_of_a_tie(
    params_file: Path, minimize: bool, trial: int, lr: float, sizes: list[int]
) -> None:
    p = load_params(params_file)
    s = hand_made(p, [ended(*row) for row in BEST_CASE], minimize=minimize, budget=8)
    assert results.best(s) == {
        "study": "trainflow",
        "trial": trial,
        "metric": "val_loss",
        "direction": "minimize" if minimize else "maximize",
        "value": BEST_CASE[trial][1],
        "params": {"train.lr": lr, "model.hidden_sizes": sizes},
    }
    none_complete = hand_made(p, [ended("PRUNED", 0.1, 0.001, [128]), ended("FAIL", None, 0.001, [128])])
    assert results.best(none_complete) is None


def test_write_puts_every_trial_in_trials_csv_and_the_best_in_best_params_yaml(
    params_file: Path, tmp_path: Path
) -> None:
    p = load_params(params_file)
    start = datetime(2026, 1, 1, 12, 0, 0)
    rows = [
        ended("COMPLETE", 0.5, 0.001, [128], intermediate_values={7: 0.6, 14: 0.5}, user_attrs={"mlflow_run_id": "r0"}),
        ended(
            "PRUNED",
            0.8,
            0.005,
            [256, 128],
            intermediate_values={7: 0.8},
            user_attrs={"mlflow_run_id": "r1", "resumed_from_update": 7},
        ),
        ended("FAIL", None, 0.0002, [128], user_attrs={"mlflow_run_id": "r2", "error": "train.x: no numbered layers"}),
        ended("COMPLETE", 0.4, 0.002, [256, 128], intermediate_values={7: 0.45, 14: 0.4}),
        create_trial(state=TrialState.WAITING),
    ]
    for n, t in enumerate(rows[:4]):
        t.datetime_start, t.datetime_complete = start, start + timedelta(seconds=10 * n + 0.5)
    out = tmp_path / "reports" / "tune"
    top = results.write(hand_made(p, rows), out)

    assert sorted(f.name for f in out.iterdir()) == [
        "best_params.yaml",
        "history.csv",
        "importance.csv",
        "optimization_history.png",
        "param_importances.png",
        "trials.csv",
    ]
    want = {
        "trial": [0, 1, 2, 3, 4],
        "state": ["complete", "pruned", "failed", "complete", "waiting"],
        "val_loss": [0.5, 0.8, None, 0.4, None],
        "last_update": [14, 7, None, 14, None],
        "train.lr": [0.001, 0.005, 0.0002, 0.002, None],
        "model.hidden_sizes": ["[128]", "[256, 128]", "[128]", "[256, 128]", None],
        "resumed_from_update": [None, 7, None, None, None],
        "seconds": [0.5, 10.5, 20.5, 30.5, None],
        "mlflow_run_id": ["r0", "r1", "r2", None, None],
        "error": [None, None, "train.x: no numbered layers", None, None],
    }
    got = pd.read_csv(out / "trials.csv")
    assert list(got.columns) == list(want)
    pd.testing.assert_frame_equal(got, pd.DataFrame(want), check_dtype=False)
    best = {
        "study": "trainflow",
        "trial": 3,
        "metric": "val_loss",
        "direction": "minimize",
        "value": 0.4,
        "params": {"train.lr": 0.002, "model.hidden_sizes": [256, 128]},
    }
    assert top == best
    assert yaml.safe_load((out / "best_params.yaml").read_text()) == best
    assert list(yaml.safe_load((out / "best_params.yaml").read_text())) == list(best)  # in this order
    history = pd.read_csv(out / "history.csv")  # complete and pruned trials; the best complete value so far
    want_history = {
        "trial": [0, 1, 3],
        "state": ["complete", "pruned", "complete"],
        "value": [0.5, 0.8, 0.4],
        "best": [0.5, None, 0.4],
    }
    pd.testing.assert_frame_equal(history, pd.DataFrame(want_history), check_dtype=False)
    assert (out / "optimization_history.png").read_bytes()[:4] == b"\x89PNG"


def test_the_history_keeps_the_best_value_so_far_in_the_studys_direction(params_file: Path) -> None:
    p = load_params(params_file)
    trials = [
        ended("COMPLETE", 0.5, 0.001, [128]),
        ended("COMPLETE", 0.7, 0.001, [128]),
        ended("PRUNED", 0.9, 0.001, [128]),
        ended("COMPLETE", 0.6, 0.001, [128]),
    ]
    for minimize, best in ((True, [0.5, 0.5, math.nan, 0.5]), (False, [0.5, 0.7, math.nan, 0.7])):
        s = hand_made(p, trials, minimize=minimize)
        history = results._history(results.trials_frame(s), s)
        assert list(history["trial"]) == [0, 1, 2, 3]
        assert history["best"].tolist() == pytest.approx(best, nan_ok=True)
    waiting = hand_made(p, [create_trial(state=TrialState.WAITING)])
    empty = results._history(results.trials_frame(waiting), waiting)
    assert list(empty.columns) == ["trial", "state", "value", "best"] and len(empty) == 0


def test_the_history_plot_draws_the_best_so_far_in_red_apart_from_the_blue_trials(
    params_file: Path, tmp_path: Path
) -> None:
    import numpy as np
    from matplotlib.colors import to_rgb
    from PIL import Image

    p = load_params(params_file)
    s = hand_made(p, [ended("COMPLETE", v, 0.001, [128]) for v in (0.9, 0.5, 0.7, 0.3, 0.6, 0.2)])
    results.write(s, tmp_path)
    pixels = np.asarray(Image.open(tmp_path / "optimization_history.png").convert("RGB")).reshape(-1, 3)

    def count(colour: str) -> int:
        return int((pixels == np.round(np.array(to_rgb(colour)) * 255)).all(axis=1).sum())

    assert count("tab:red") > 500  # the step line across the plot (and its legend entry)
    assert count("tab:blue") > 100  # the trials' points


def test_a_failed_write_of_best_params_leaves_the_previous_file_whole(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = load_params(params_file)
    s = hand_made(p, [ended("COMPLETE", 0.5, 0.001, [128])])
    out = tmp_path / "tune"
    results.write(s, out)
    before = (out / "best_params.yaml").read_text()
    # A text that fails half-way through being written (it cannot be encoded): the file being written is cut short.
    monkeypatch.setattr(results.yaml, "safe_dump", lambda *a, **k: "study: " + "x" * 10_000 + "\udc80")
    with pytest.raises(UnicodeEncodeError):
        results.write(s, out)
    assert (out / "best_params.yaml").read_text() == before
    assert not [f.name for f in out.iterdir() if f.name.endswith(".tmp")]


def test_importances_rank_the_param_that_decides_the_value_and_leave_out_constant_ones(params_file: Path) -> None:
    p = load_params(params_file)
    drop = FloatDistribution(0.0, 0.5)
    trials = []
    for i in range(12):
        lr = 0.0001 * 1.5**i
        trials.append(
            create_trial(
                value=1000 * lr,  # the value is the lr's alone
                params={"train.lr": lr, "model.hidden_sizes": ["[128]", "[256, 128]"][i % 2], "model.dropout": 0.1},
                distributions={"train.lr": LR, "model.hidden_sizes": SIZES, "model.dropout": drop},
            )
        )
    scores = results._importance(hand_made(p, trials)).set_index("param")["importance"]
    assert set(scores.index) == {"train.lr", "model.hidden_sizes"}  # dropout never varied
    assert scores["train.lr"] > 0.9 > scores["model.hidden_sizes"]
    assert scores.sum() == pytest.approx(1.0)
    one = results._importance(hand_made(p, trials[:1]))
    assert list(one.columns) == ["param", "importance"] and len(one) == 0
    same = [ended("COMPLETE", v, 0.001, [128]) for v in (0.1, 0.2)]  # two complete trials, nothing varied
    assert len(results._importance(hand_made(p, same))) == 0


def test_a_study_whose_trials_all_scored_alike_writes_its_results_without_importances(
    params_file: Path, tmp_path: Path
) -> None:
    """val_accuracy 1.0 in every trial (iris): fANOVA has no variance to explain. (It raised, and `trainflow tune`
    failed after its last trial, writing no plots.)"""
    p = load_params(params_file)
    s = hand_made(p, [ended("COMPLETE", 1.0, lr, [128]) for lr in (0.001, 0.002, 0.004)], minimize=False)
    top = results.write(s, tmp_path)
    assert top is not None and top["trial"] == 0
    assert len(pd.read_csv(tmp_path / "importance.csv")) == 0
    assert (tmp_path / "param_importances.png").is_file()


def test_apply_writes_the_best_params_and_the_trial_into_params_yaml(params_file: Path) -> None:
    write_overrides(params_file, ["train.layer_decay=0.9"])
    best = {"train.lr": 0.004, "model.hidden_sizes": [512, 256], "train.layer_decay": None}
    written = results.apply({"study": "s1", "trial": 3, "params": best}, params_file)
    assert written == [
        "train.lr=0.004",
        "model.hidden_sizes=[512, 256]",
        "train.layer_decay=null",
        'register.tags.tune_study="s1"',
        "register.tags.tune_trial='3'",
    ]
    p = load_params(params_file)
    assert (p.train.lr, p.model.hidden_sizes, p.train.layer_decay) == (0.004, [512, 256], None)
    assert p.register.tags == {"tune_study": "s1", "tune_trial": "3"}
    assert "# micro-batch size" in params_file.read_text()  # comments kept


# --- the files of reports/tune/, as text and as drawn -----------------------------------------------------------


def kept_figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures results.write draws, kept open (closed by the caller) instead of closed once saved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainflow.tune import results

    kept: list[Any] = []
    monkeypatch.setattr(results, "_figure", lambda: SimpleNamespace(subplots=plt.subplots, close=kept.append))
    return kept


def tiny_study(params_file: Path, minimize: bool = True) -> Any:
    """Trials 0-4 of the default space: complete 0.5, pruned 0.8, complete 0.3 (resumed at update 7), running,
    failed."""
    from datetime import datetime, timedelta

    from optuna.trial import TrialState, create_trial
    from support.sweeps import ended, hand_made

    from trainflow.params import load_params

    start = datetime(2026, 1, 1, 12, 0, 0)
    rows = [
        ended("COMPLETE", 0.5, 0.001, [128], intermediate_values={7: 0.6, 14: 0.5}, user_attrs={"mlflow_run_id": "r0"}),
        ended("PRUNED", 0.8, 0.004, [256, 128], intermediate_values={7: 0.8}),
        ended("COMPLETE", 0.3, 0.002, [512, 256], intermediate_values={7: 0.4, 21: 0.3},
              user_attrs={"resumed_from_update": 7}),
        create_trial(state=TrialState.RUNNING, params={}, distributions={}),
        ended("FAIL", None, 0.0002, [128], user_attrs={"error": "model: no numbered layers"}),
    ]  # fmt: skip
    for n, t in enumerate(rows):
        if t.state != TrialState.RUNNING:
            t.datetime_start, t.datetime_complete = start, start + timedelta(seconds=2 * n + 1)
    return hand_made(load_params(params_file), rows, minimize=minimize)


def test_trials_csv_and_the_history_are_written_as_this_exact_text(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Updates as whole numbers, lists as JSON text, a running trial with its state, blanks where nothing is known."""
    from trainflow.tune import results

    kept = kept_figures(monkeypatch)
    try:
        top = results.write(tiny_study(params_file), tmp_path)
    finally:
        import matplotlib.pyplot as plt

        for fig in kept:
            plt.close(fig)
    assert (tmp_path / "trials.csv").read_text() == (
        "trial,state,val_loss,last_update,train.lr,model.hidden_sizes,resumed_from_update,seconds,mlflow_run_id,error\n"
        "0,complete,0.5,14,0.001,[128],,1.0,r0,\n"
        '1,pruned,0.8,7,0.004,"[256, 128]",,3.0,,\n'
        '2,complete,0.3,21,0.002,"[512, 256]",7,5.0,,\n'
        "3,running,,,,,,,,\n"
        "4,failed,,,0.0002,[128],,9.0,,model: no numbered layers\n"
    )
    assert (tmp_path / "history.csv").read_text() == (
        "trial,state,value,best\n0,complete,0.5,0.5\n1,pruned,0.8,\n2,complete,0.3,0.3\n"
    )
    assert (tmp_path / "best_params.yaml").read_text() == (
        "study: trainflow\ntrial: 2\nmetric: val_loss\ndirection: minimize\nvalue: 0.3\n"
        "params:\n  train.lr: 0.002\n  model.hidden_sizes:\n  - 512\n  - 256\n"
    )
    assert top is not None and top["params"] == {"train.lr": 0.002, "model.hidden_sizes": [512, 256]}


def test_the_history_plot_draws_complete_and_pruned_trials_apart_and_the_best_so_far_as_a_step(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba
    from PIL import Image

    from trainflow.tune import results

    kept = kept_figures(monkeypatch)
    results.write(tiny_study(params_file, minimize=False), tmp_path)
    history, importance = kept
    try:
        ax = history.axes[0]
        complete, pruned = ax.collections
        assert complete.get_offsets().tolist() == [[0, 0.5], [2, 0.3]]
        assert pruned.get_offsets().tolist() == [[1, 0.8]]
        assert [tuple(c.get_facecolor()[0]) for c in (complete, pruned)] == [to_rgba("tab:blue"), to_rgba("tab:gray")]
        assert (complete.get_zorder(), pruned.get_zorder()) == (2, 2)
        (step,) = ax.lines
        assert list(step.get_xdata()) == [0, 1, 2]
        assert [v if v == v else None for v in step.get_ydata()] == [0.5, None, 0.5]  # maximised: 0.3 is not better
        assert (step.get_drawstyle(), to_rgba(step.get_color())) == ("steps-post", to_rgba("tab:red"))
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["complete (2)", "pruned (1)", "best so far"]
        assert tuple(history.get_size_inches()) == (7, 4)

        bars = importance.axes[0]
        assert bars.get_title() == "Parameter importances"
        assert tuple(importance.get_size_inches()) == (7, 2.2)  # lr and hidden_sizes varied: a row each
        assert len(bars.patches) == 2
    finally:
        for fig in kept:
            plt.close(fig)
    for name, size in (("optimization_history.png", (700, 400)), ("param_importances.png", (700, 220))):
        with Image.open(tmp_path / name) as png:
            assert png.size == size and "Software" not in png.info  # 100 dpi, no matplotlib version stamp


def test_the_importance_plot_has_a_bar_per_param_largest_on_top(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba
    from PIL import Image

    from trainflow.tune import results

    kept = kept_figures(monkeypatch)
    importance = pd.DataFrame({"param": ["train.lr", "model.dropout"], "importance": [0.75, 0.25]})
    results._importance_png(importance, tmp_path / "imp.png")
    (fig,) = kept
    try:
        ax = fig.axes[0]
        assert [p.get_width() for p in ax.patches] == [0.25, 0.75]  # barh draws bottom-up: the largest on top
        assert [t.get_text() for t in ax.get_yticklabels()] == ["model.dropout", "train.lr"]
        assert {to_rgba(p.get_facecolor()) for p in ax.patches} == {to_rgba("tab:blue")}
        assert (ax.get_xlabel(), ax.get_title()) == ("importance (fANOVA, sums to 1)", "Parameter importances")
        assert tuple(fig.get_size_inches()) == (7, 2.2)
    finally:
        plt.close(fig)
    with Image.open(tmp_path / "imp.png") as png:
        assert png.size == (700, 220) and "Software" not in png.info
    results._importance_png(pd.DataFrame(columns=["param", "importance"]), tmp_path / "none.png")
    with Image.open(tmp_path / "none.png") as png:
        assert png.size == (700, 170)  # no importances: one row's room
    for fig in kept[1:]:
        plt.close(fig)


def test_the_history_plot_puts_the_trial_on_x_and_the_metric_on_y(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    kept: list[Any] = []
    monkeypatch.setattr(results, "_figure", lambda: SimpleNamespace(subplots=plt.subplots, close=kept.append))
    p = load_params(params_file)
    results.write(hand_made(p, [ended("COMPLETE", v, 0.001 * (1 + v), [128]) for v in (0.9, 0.5, 0.7)]), tmp_path)
    history, importance = kept
    try:
        ax = history.axes[0]
        assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
            "trial",
            "val_loss",
            "Study trainflow: optimisation history",
        )
        assert importance.axes[0].get_xlabel() == "importance (fANOVA, sums to 1)"
    finally:
        for fig in kept:
            plt.close(fig)
