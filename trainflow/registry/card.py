"""The model card of a registered version: one Markdown page and one self-contained HTML page (plots embedded as
data URIs), built from what the run wrote — registration.json, metrics.json, per_class.csv, the splits and the
plots — and the model's outputs on the test rows.

Sections: lineage (commit, data hash, why the run ran: the changes since the champion), data (rows per split, class
balance, rows new since the champion), test metrics with 95% bootstrap intervals, the paired comparison with the
champion and its slices, calibration (reliability by confidence bin) and per-class tables, and the plots. The register
stage writes reports/card.md and reports/card.html, logs both with the version's MLflow run (`card/`), and the flow
publishes the Markdown as an artifact; `trainflow models show NAME@ALIAS` prints it.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainflow import baselines
from trainflow.core.paths import SPLITS, Paths
from trainflow.data.stream import Split
from trainflow.registry.gate import MINIMIZE, Scored, per_row, resampled

CI_RESAMPLES = 2000
CALIBRATION_BINS = 10


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)  # paragraphs
    tables: list[tuple[list[str], list[list[str]]]] = field(default_factory=list)  # (header, rows)
    images: list[tuple[str, Path]] = field(default_factory=list)  # (caption, PNG)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def intervals(metrics: dict[str, Any], scored: Scored | None, seed: int) -> list[list[str]]:
    """Each test metric, with a 95% percentile bootstrap interval where it is a mean over rows (or built from one)."""
    rows = []
    idx = None
    if scored is not None and len(scored.labels):
        n = len(scored.labels)
        idx = np.random.default_rng(seed).integers(0, n, size=(CI_RESAMPLES, n)) if n * CI_RESAMPLES < 5e7 else None
    for name, value in sorted(metrics.items()):
        if name == "n_test":
            continue
        interval = "—"
        if idx is not None and scored is not None and (per_row(name, scored) is not None or name == "r2"):
            boot = resampled(name, scored, idx)
            boot = boot[np.isfinite(boot)]
            if len(boot):
                interval = f"[{np.quantile(boot, 0.025):.4g}, {np.quantile(boot, 0.975):.4g}]"
        better = "lower" if name in MINIMIZE else "higher"
        rows.append([name, _fmt(float(value)), interval, f"{better} is better"])
    return rows


def calibration(scored: Scored) -> list[list[str]]:
    """Reliability: per bin of the top class's probability, the rows, their mean confidence and their accuracy.

    Bin b holds the confidences in (b / bins, (b + 1) / bins], the first also 0: closed on the right, as the ece in
    metrics.json bins them (and sklearn's calibration_curve), so a row exactly on an edge is counted in the same bin
    by both. The edges are b / bins, exact where a decimal can be (np.linspace's 0.30000000000000004 is not 0.3)."""
    confidence = scored.outputs.max(axis=1)
    right = scored.outputs.argmax(axis=1) == scored.labels
    edges = np.arange(CALIBRATION_BINS + 1) / CALIBRATION_BINS
    bins = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, CALIBRATION_BINS - 1)
    rows = []
    for b in range(CALIBRATION_BINS):
        mask = bins == b
        if mask.any():
            rows.append([f"{edges[b]:.1f}–{edges[b + 1]:.1f}", str(int(mask.sum())),
                         f"{confidence[mask].mean():.3f}", f"{right[mask].mean():.3f}"])  # fmt: skip
    return rows


def commit_note(tags: dict[str, str]) -> str:
    """What the git commit row adds: whether the code trained was the commit's. `trainflow run -S` rewrites
    params.yaml, so the tree is dirty while the code is not (code_dirty, which verify checks); a version registered
    before code_dirty was recorded has only git_dirty."""
    code_dirty, git_dirty = tags.get("code_dirty"), tags.get("git_dirty") == "true"
    if code_dirty == "true" or (code_dirty is None and git_dirty):
        return " (uncommitted code changes)" if code_dirty else " (uncommitted changes)"
    return " (the commit's code; params.yaml or data changed since)" if git_dirty else ""


def sections(
    paths: Paths, reg: dict[str, Any], metrics: dict[str, Any], scored: Scored | None, seed: int
) -> list[Section]:
    tags = reg.get("tags") or {}
    why = reg.get("why") or {}
    lineage = Section("Lineage")
    dirty = commit_note(tags)
    lineage.tables.append((["", ""], [
        ["git commit", f"{tags.get('git_commit', '—')}{dirty}"],
        ["data (DVC hash of data/splits)", tags.get("data_hash", "—")],
        ["params hash", tags.get("params_hash", "—")],
        ["MLflow run", tags.get("mlflow_run_id", "—")],
        ["model sha256", tags.get("model_sha256", "—")],
    ]))  # fmt: skip
    if why.get("summary"):
        lineage.text.append(f"Why this run ran: {why['summary']}")
    if why.get("params"):
        lineage.tables.append((["params changed since the champion"], [[p] for p in why["params"]]))

    data = Section("Data")
    sizes = [[s, str(_rows(Split.stored(paths.splits, s)))] for s in SPLITS]
    data.tables.append((["split", "rows"], sizes))
    target = tags.get("target")
    if tags.get("task") == "classification" and target:
        counts = {s: Split.stored(paths.splits, s).column(target).astype(str).value_counts() for s in SPLITS}
        classes = sorted(set().union(*(c.index for c in counts.values())))
        data.tables.append(
            (["class", *SPLITS], [[c, *(str(int(counts[s].get(c, 0))) for s in SPLITS)] for c in classes])
        )
    if why.get("data"):
        data.text.append("Changes to the data since the champion: " + "; ".join(why["data"]))

    test = Section("Test metrics")
    own, _ = baselines.split_metrics(metrics)
    rows = intervals(own, scored, seed)
    if line := baselines.versus(metrics, reg.get("gate_metric")):
        rows.append(["the network vs the baselines", line, "—", "fitted on the same train split, scored on the same "
                     "test rows"])  # fmt: skip
    test.tables.append((["metric", "value", "95% interval (bootstrap)", ""], rows))
    test.text.append(f"On {metrics.get('n_test', '?')} test rows. Decision: {reg.get('decision', '—')}")

    out = [lineage, data, test]
    if c := reg.get("comparison"):
        comparison = Section("Against the champion (paired, on the same test rows)")
        comparison.tables.append((["", ""], [
            ["challenger", _fmt(c["challenger"])], ["champion", _fmt(c["champion"])],
            ["improvement", _fmt(c["improvement"])],
            [f"{c['confidence']:.0%} one-sided bounds", f"[{_fmt(c['low'])}, {_fmt(c['high'])}]"],
            ["test", c["test"]],
        ]))  # fmt: skip
        if c.get("slices"):
            comparison.tables.append((
                ["slice", "rows", "metric", "challenger", "champion", "improvement"],
                [[s["slice"], str(s["rows"]), s["metric"], _fmt(s["challenger"]), _fmt(s["champion"]),
                  _fmt(s["improvement"])] for s in c["slices"]],
            ))  # fmt: skip
        out.append(comparison)
    if scored is not None and scored.outputs.ndim == 2:
        calib = Section("Calibration and classes")
        calib.tables.append((["confidence", "rows", "mean confidence", "accuracy"], calibration(scored)))
        if paths.per_class.is_file():
            per_class = pd.read_csv(paths.per_class)
            calib.tables.append(
                (list(per_class.columns), [[_fmt(v) for v in row] for row in per_class.itertuples(index=False)])
            )
        out.append(calib)
    plots = Section("Plots")
    for caption, path in (
        ("training curves", paths.reports / "plots" / "training_curves.png"),
        ("test predictions", paths.test_plots / "predictions.png"),
        ("ROC and precision-recall", paths.test_plots / "roc_pr.png"),
    ):
        if path.is_file():
            plots.images.append((caption, path))
    out.append(plots)
    return out


def _rows(split: Split) -> int:
    return len(split) if split.exists() else 0


def markdown(title: str, parts: list[Section]) -> str:
    lines = [f"# {title}", ""]
    for s in parts:
        lines += [f"## {s.title}", ""]
        for t in s.text:
            lines += [t, ""]
        for header, rows in s.tables:
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "|".join("---" for _ in header) + "|")
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
            lines.append("")
        for caption, path in s.images:
            lines += [f"![{caption}]({path.name})", ""]
    return "\n".join(lines)


def page(title: str, parts: list[Section]) -> str:
    """One self-contained HTML page: the same sections, the plots embedded as base64 PNGs."""
    e = html.escape
    body = [f"<h1>{e(title)}</h1>"]
    for s in parts:
        body.append(f"<h2>{e(s.title)}</h2>")
        body += [f"<p>{e(t)}</p>" for t in s.text]
        for header, rows in s.tables:
            body.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
            body += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows]
            body.append("</table>")
        for caption, path in s.images:
            data = base64.b64encode(path.read_bytes()).decode()
            body.append(f'<figure><img alt="{e(caption)}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{e(caption)}</figcaption></figure>")  # fmt: skip
    style = ("body{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:2px 8px;"
             "text-align:left}img{max-width:100%}")  # fmt: skip
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{style}</style>"
            f"</head><body>{''.join(body)}</body></html>\n")  # fmt: skip


def write(paths: Paths, reg: dict[str, Any], metrics: dict[str, Any], scored: Scored | None, seed: int) -> list[Path]:
    """reports/card.md and reports/card.html for the version `reg` names."""
    from trainflow.core.io import atomic_path

    title = f"Model card: {reg['model_name']} v{reg['version']}"
    parts = sections(paths, reg, metrics, scored, seed)
    out = []
    for path, text in (
        (paths.reports / "card.md", markdown(title, parts)),
        (paths.reports / "card.html", page(title, parts)),
    ):
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
        out.append(path)
    return out
