"""What a flow run shows in Prefect: markdown built from the pipeline's reports. Pure functions of the JSON the stages
write (reports/metrics.json, train_run.json, registration.json), so they are tested without Prefect; the flow
publishes them as artifacts, also when every stage was up to date.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainflow import baselines
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.data.schema import Schema
from trainflow.registry.registry import MINIMIZE

NONE = "—"


@dataclass(frozen=True)
class Artifact:
    key: str  # Prefect's artifact key: lowercase letters, digits and dashes; the UI groups runs' artifacts by it
    description: str
    markdown: str


def fmt(value: Any) -> str:
    """A table cell: floats to 4 decimals, None as a dash, pipes escaped so they cannot break the table."""
    if value is None:
        return NONE
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]], align: str = "---") -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([align] * len(header)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def metrics_markdown(metrics: dict[str, Any], registration: dict[str, Any] | None) -> str:
    """The new test metrics beside those of the champion this version was compared with.

    Every metric of the champion is shown when registration.json carries `previous_metrics` (its metrics on the same
    test data); otherwise only its gate metric, as recorded in the registry.
    """
    reg = registration or {}
    gate = reg.get("gate_metric")
    version = reg.get("version")
    previous = reg.get("previous_champion")
    previous_metrics = reg.get("previous_metrics")
    if not isinstance(previous_metrics, dict):
        previous_metrics = {gate: reg.get("previous_value")} if gate and previous is not None else {}

    this = f"this run (v{version})" if version is not None else "this run"
    champion = f"champion before it (v{previous})" if previous is not None else "champion before it"
    rows = []
    for name in [*metrics, *(k for k in previous_metrics if k not in metrics)]:
        label = name
        if name == gate:
            label = f"**{name}** (gate, {'lower' if name in MINIMIZE else 'higher'} is better)"
        rows.append([label, fmt(metrics.get(name)), fmt(previous_metrics.get(name))])

    title = f"## Test metrics: {reg['model_name']} v{version}" if "model_name" in reg else "## Test metrics"
    parts = [title, "", _table(["metric", this, champion], rows)]
    if not reg:  # not registered (the run stopped before register): no champion to speak of
        pass
    elif previous is None:
        parts += ["", "No earlier champion: this is the first version of the model."]
    elif reg.get("previous_value") is None:
        parts += ["", f"The champion (v{previous}) could not be scored on this run's test data: see the decision."]
    elif reg.get("rescored"):
        parts += ["", f"The champion (v{previous}) was rescored on this run's test data."]
    else:
        parts += ["", f"v{previous}'s metrics are those recorded when it was registered."]
    return "\n".join(parts) + "\n"


def run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The MLflow UI page of a run when the tracking server is reachable over http(s), else None."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def mlflow_run_markdown(train_run: dict[str, Any]) -> str:
    """Where the training run is: a link for an MLflow server, else the store and the command to browse it."""
    uri = str(train_run.get("tracking_uri", ""))
    exp, run = str(train_run.get("experiment_id") or ""), str(train_run.get("run_id") or "")
    lines = ["## MLflow run", ""]
    if train_run.get("tracking_error"):
        lines += [
            f"MLflow tracking at `{uri}` failed during training ({fmt(train_run['tracking_error'])}); the metrics "
            "were kept in `reports/train_metrics_local.json`, and the register stage logs the model to MLflow "
            "once the server answers.",
            "",
        ]
        if not run:
            return "\n".join(lines)
    link = run_link(uri, exp, run)
    lines.append(f"- run: [{run}]({link})" if link else f"- run: `{run}` (experiment {exp})")
    if train_run.get("model_uri"):
        lines.append(f"- logged model: `{train_run['model_uri']}`")
    lines.append(f"- tracking store: `{uri}`")
    if not link:
        lines += [
            "",
            "Browse it on the machine that ran the flow:",
            "",
            f"    mlflow ui --backend-store-uri {uri}",
            "",
            f"then open http://127.0.0.1:5000/#/experiments/{exp}/runs/{run}",
        ]
    return "\n".join(lines) + "\n"


def decision_line(reg: dict[str, Any]) -> str:
    """One line: did this version take the champion alias, and why — the register stage's own words."""
    return str(reg.get("decision") or "no decision recorded (registered by an older trainflow)")


def comparison_markdown(c: dict[str, Any]) -> str:
    """The paired gate's evidence (register.decide: paired): both models on the same test rows."""
    pct = f"{c['confidence']:.0%}"
    rows = [
        ["challenger", fmt(c["challenger"])],
        ["champion", fmt(c["champion"])],
        ["improvement", fmt(c["improvement"])],
        [f"{pct} one-sided bounds", f"[{fmt(c['low'])}, {fmt(c['high'])}]"],
        ["test", str(c["test"])],
    ]
    if m := c.get("mcnemar"):
        rows.append(
            ["McNemar (exact)", f"only the challenger right on {m['challenger_only']} rows, only the champion on "
             f"{m['champion_only']}: p = {fmt(m['p_value'])}"]
        )  # fmt: skip
    out = f"Paired comparison on the same {c['rows']} test rows ({c['metric']}):\n\n" + _table(["", ""], rows)
    if slices := c.get("slices"):
        header = ["slice", "rows", "metric", "challenger", "champion", "improvement", "only challenger right",
                  "only champion right"]  # fmt: skip
        table = [
            [str(x["slice"]), str(x["rows"]), str(x["metric"]), fmt(x["challenger"]), fmt(x["champion"]),
             fmt(x["improvement"]), str(x.get("challenger_only", NONE)), str(x.get("champion_only", NONE))]
            for x in slices
        ]  # fmt: skip
        out += "\n\nBy slice (for reading; the decision is on all the rows):\n\n" + _table(header, table)
    return out


def registry_markdown(reg: dict[str, Any]) -> str:
    """The registry version this run created, the champion decision, how to load the champion, the lineage."""
    name = reg["model_name"]
    previous = reg.get("previous_champion")
    rows = [
        ["model version", f"`{reg['model_uri']}`"],
        ["gate metric", fmt(reg["gate_metric"])],
        [f"v{reg['version']}", fmt(reg["value"])],
        ["previous champion", f"v{previous} ({fmt(reg.get('previous_value'))})" if previous is not None else NONE],
        ["champion now", f"v{reg['champion_version']}" if reg.get("champion_version") is not None else NONE],
    ]
    parts = [
        f"## Registry decision: {name} v{reg['version']}",
        "",
        f"**{decision_line(reg)}**",
        "",
        _table(["", ""], rows),
        "",
        f"Load the champion: `trainflow.serving.load('models:/{name}@champion')`",
    ]
    if not reg.get("champion"):
        parts += ["", f"Load this run's version: `trainflow.serving.load('{reg['model_uri']}')`"]
    if c := reg.get("comparison"):
        parts += ["", comparison_markdown(c)]
    if reason := reg.get("why"):
        parts += ["", f"Why this run ran: {reason['summary']}"]
    tags = reg.get("tags") or {}
    if tags:
        parts += [
            "",
            "Lineage tags of this version:",
            "",
            # `params`, every resolved param as one JSON text (what verify retrains with), stays on the registry
            # version; params_hash names it here
            _table(["tag", "value"], [[k, fmt(v)] for k, v in tags.items() if k != "params"]),
        ]
    return "\n".join(parts) + "\n"


def artifacts(paths: Paths) -> list[Artifact]:
    """The markdown artifacts for the reports that exist under `paths` (all three after a successful run)."""
    registration = read_json(paths.registration) if paths.registration.is_file() else None
    out = []
    if paths.metrics.is_file():
        out.append(
            Artifact(
                "training-metrics",
                "Test metrics of this run's model beside the champion's",
                metrics_markdown(read_json(paths.metrics), registration),
            )
        )
    if paths.train_run.is_file():
        out.append(
            Artifact(
                "mlflow-run", "The MLflow run that trained the model", mlflow_run_markdown(read_json(paths.train_run))
            )
        )
    card = paths.reports / "card.md"
    if card.is_file():
        out.append(Artifact("model-card", "The registered version's model card", card.read_text(encoding="utf-8")))
    if registration is not None:
        out.append(
            Artifact("registry-decision", "Registry version and champion decision", registry_markdown(registration))
        )
    return out


def summary(paths: Paths, results: dict[str, Any]) -> str:
    """What a person wants to know after a run: where the metrics, the model and the registry version are."""
    lines = ["", "trainflow: pipeline finished"]
    ran = [k for k, v in results.items() if not v.get("skipped")]
    lines.append(f"  stages run: {', '.join(ran) if ran else 'none (everything up to date)'}")
    if paths.split_schema.is_file():
        schema = Schema.read(paths.split_schema)
        lines.append(f"  task:     {schema.task} ({schema.task_reason or 'from the schema'})")
        if chosen := features_line(schema):
            lines.append(f"  features: {chosen}")
    registration = read_json(paths.registration) if paths.registration.is_file() else {}
    if paths.metrics.is_file():
        metrics = read_json(paths.metrics)
        own, _ = baselines.split_metrics(metrics)
        shown = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in own.items())
        lines.append(f"  metrics:  {paths.metrics}  ({shown})")
        if versus := baselines.versus(metrics, registration.get("gate_metric")):  # none for text, images, streamed
            lines.append(f"  baseline: {versus} on the same test rows")
    if paths.final.joinpath("training.json").is_file():
        lines.append(f"  trained:  {trained_line(read_json(paths.final / 'training.json'))}")
    lines.append(f"  model:    {paths.final}")
    lines.append(f"  plots:    {paths.plots}")
    if reg := registration:
        champ = "now champion" if reg["champion"] else f"champion stays version {reg['champion_version']}"
        if results.get("register", {}).get("skipped") or str(reg.get("decision", "")).startswith("no new version"):
            champ = "registered by an earlier run; " + ("champion" if reg["champion"] else champ)
        lines.append(f"  registry: {reg['model_uri']} ({champ}; {reg['gate_metric']}={reg['value']:.4f})")
        if reg.get("decision"):
            lines.append(f"  decision: {reg['decision']}")
        lines.append(f"  load it:  trainflow.serving.load('{load_uri(reg)}')")
    return "\n".join(lines)


def trained_line(training: dict[str, Any]) -> str:
    """How long the model trained and how long it was planned to (train.epochs auto resolves to a number)."""
    said = f"{training.get('updates', '?')} updates, {training.get('epochs', '?')} epochs"
    if (planned := training.get("epochs_planned")) is not None:
        said += f" of {planned} planned ({training.get('updates_planned', '?')} updates)"
    if training.get("stopped_early"):
        said += f"; stopped early, best at update {training.get('best_update', '?')}"
    return said


def load_uri(reg: dict[str, Any]) -> str:
    """The URI that loads this run's model: the champion alias when its version became champion, else the version
    itself (the champion is then another model, maybe of another data set under the same register.model_name)."""
    return f"models:/{reg['model_name']}@champion" if reg.get("champion") else str(reg["model_uri"])


MAX_LISTED = 12  # feature names the summary lists before "... (N more)"


def features_line(schema: Schema) -> str | None:
    """The features the splits (and so the model) were built with, when data.features or data.exclude chose them:
    -S overrides persist in params.yaml, and the summary says what they left in. None when neither is set."""
    chosen, excluded = schema.data_params.get("features"), schema.data_params.get("exclude") or []
    if chosen is None and not excluded:
        return None
    names = [*schema.features, *(c for c in (schema.text_column, schema.image_column) if c)]
    shown = ", ".join(names[:MAX_LISTED]) + (
        f", ... ({len(names) - MAX_LISTED} more)" if len(names) > MAX_LISTED else ""
    )
    why = [f"data.features: [{', '.join(chosen)}]"] if chosen is not None else []
    why += [f"data.exclude: [{', '.join(excluded)}]"] if excluded else []
    return f"{len(names)} used: {shown or 'none'} ({'; '.join(why)})"
