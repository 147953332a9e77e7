"""Model registry: a new version with lineage tags, the `challenger` alias, and the champion gate.

Every registration creates a version and points `challenger` at it. `champion` moves to it only if it beats the
champion on the gate metric, both scored on the same test rows. `register.decide: paired` (the default): the champion
is re-scored on this run's test split and the two are compared row by row (trainflow.registry.gate: a paired
permutation test
of the improvement; promoted when it shows one above `register.min_improvement`). `point`: the challenger's
value must beat the champion's by more than `register.min_improvement`; the champion's metrics are taken from its tags
when it was scored on a test split with the same hash, else it is re-scored first. If the champion cannot be
re-scored, it stays champion and the decision says why.

A decision is made only on the registry's answers. "No champion" is the registry saying the alias does not exist;
any other failure of a lookup (a timeout, a 503, a locked store) is a ServiceError that decides nothing and leaves the
champion alias as it was, and so is an outage while re-scoring the champion. The register task retries it with
backoff (tasks/retry.py) and a rerun completes the registration, since a run registers at most one version.

The whole decision runs under an exclusive lock (trainflow.registry.lock: a file beside a local store, a lock the
registry holds for a shared one), so two registrations at once never both see "no better champion" and both take the
alias, and each decides against the champion that holds the alias when it moves it (its AGAINST_TAG).
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.artifacts import manifest
from trainflow.core import outage
from trainflow.core.errors import ServiceError, UserError
from trainflow.core.io import disk_full, failpoint, no_space
from trainflow.params import RegisterParams
from trainflow.registry import gate as paired
from trainflow.registry.lock import is_lock, registry_lock

if TYPE_CHECKING:
    import numpy as np

    from trainflow.data.split import Held

MINIMIZE = paired.MINIMIZE  # gate metrics where lower is better (defined once, in trainflow.registry.gate)
CHAMPION, CHALLENGER = "champion", "challenger"
TEST_HASH_TAG = "test_data_hash"
DECISION_TAG = "registry_decision"
AGAINST_TAG = "decided_against"  # version tag: the champion version its decision compared it with ("none": the first)
MODEL_TAG = "model_sha256"  # version tag: the hash of models/final's files (tracking.model_hash)
HISTORY_TAG = "champion_history"  # registered model tag: the champion versions, oldest first (JSON), for rollback
CHANGE_TAG = "champion_change"  # version tag: how and why it (last) became champion
FLAVOR_TAG = "flavor"  # version tag: how the model is stored (register.flavor; a version without it: package)
GENERATION_TAG = "split_generation"  # version tag: the split assignment's generation it was trained on
LINEAGE_TAG = "split_assignment"  # version tag: the lineage of that assignment (split.TIME + column: a time split)

# models:/name/version -> its metrics and per-row outputs on the current test split
Rescore = Callable[[str], tuple[dict[str, float], paired.Scored]]
RERUN_REGISTER = (
    "Rerun `trainflow stage register` (or the flow) once it answers: the rerun completes this registration, and a run "
    "never registers a second version"
)
RERUN_MODELS = "Rerun the `trainflow models` command once it answers"


def beats(new: float, old: float | None, metric: str, min_improvement: float) -> bool:
    """The point rule: `new` better than `old` by more than `min_improvement`."""
    if old is None:
        return True
    return new < old - min_improvement if metric in MINIMIZE else new > old + min_improvement


def gate_metric(params: RegisterParams, metrics: dict[str, float]) -> str:
    """register.gate_metric, resolved: auto = accuracy (classification) or r2 (regression)."""
    gate = params.gate_metric
    if gate == "auto":
        gate = "accuracy" if "accuracy" in metrics else "r2"
    if gate not in metrics:
        from trainflow.core.errors import ParamsError

        raise ParamsError(
            "params.yaml",
            [("register.gate_metric", f"{gate} is not measured for this task; the metrics are {sorted(metrics)}")],
        )
    return gate


def registry_failed(what: str, exc: BaseException, rerun: str) -> ServiceError:
    """The error for a registry call that failed without an answer: it names the store and says nothing changed."""
    import mlflow

    return ServiceError(
        f"{what}: the MLflow tracking store at {mlflow.get_tracking_uri()} did not answer ({type(exc).__name__}: "
        f"{exc}). That is no answer about what the registry holds, so nothing was decided and the champion alias is "
        f"as it was. {rerun}."
    )


def lookup(call: Callable[[], Any], what: str, rerun: str = RERUN_REGISTER) -> Any | None:
    """`call()`, a registry lookup, or None when the registry answers that the thing does not exist
    (outage.not_found). Any other failure is raised as a ServiceError (`registry_failed`), never taken for "absent":
    a 503 or a timeout that outlasted MLflow's own HTTP retries (tracking.HTTP_DEFAULTS), a locked SQLite store, a
    proxy's 404. The register task retries it with backoff (tasks/retry.py)."""
    from mlflow.exceptions import MlflowException

    try:
        return call()
    except MlflowException as exc:
        if outage.not_found(exc):
            return None
        if exc.error_code == "PERMISSION_DENIED":
            import mlflow

            raise NotAllowed(
                f"{what}: the registry at {mlflow.get_tracking_uri()} refused it for {_user()} ({exc.message}); "
                "nothing was changed. Ask for read permission on the model (MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD say who you are)"
            ) from None
        raise registry_failed(what, exc, rerun) from exc


def current_champion(client: Any, name: str, rerun: str = RERUN_REGISTER) -> Any | None:
    """The model version holding the `champion` alias, or None when the registry answers that there is none (no alias
    yet, or no such model). A lookup that fails otherwise raises (`lookup`): it never makes a first champion."""
    what = f"looking up the champion of {name!r}"
    # The model first: a server with access control refuses an alias of a model that does not exist (403, where a
    # plain server says "not found"), and a first registration must read that as "no champion".
    if lookup(lambda: client.get_registered_model(name), what, rerun) is None:
        return None
    return lookup(lambda: client.get_model_version_by_alias(name, CHAMPION), what, rerun)


def tagged_metrics(version: Any) -> dict[str, float]:
    return {k.removeprefix("metric."): float(v) for k, v in version.tags.items() if k.startswith("metric.")}


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or while handling: predict.load turns MLflow's error into a
    UserError `from None`, which hides the original from tracebacks but keeps it as __context__."""
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def champion_metrics(
    champion: Any, gate: str, test_hash: str, rescore: Rescore, rows: bool
) -> tuple[dict[str, float], paired.Scored | None]:
    """(the champion's metrics on the current test data, its per-row outputs when it was re-scored for them).

    Re-scored when `rows` (the paired rule needs its outputs row by row) or when its own tags were measured on a test
    split with another hash; else its tags serve."""
    tagged = tagged_metrics(champion)
    if not rows and champion.tags.get(TEST_HASH_TAG) == test_hash and gate in tagged:
        return tagged, None
    return rescore(f"models:/{champion.name}/{champion.version}")


KIND = ("target", "task")  # registered model tags: what every version of the name predicts


def check_kind(client: Any, name: str, tags: dict[str, str]) -> None:
    """One registered name holds one kind of model: refuse a version whose target or task (`tags`) differs from what
    the name's versions predict (the registered model's KIND tags, else, for a name registered before they were
    written, its newest version's). Its metrics would be compared with metrics of another thing, or not exist
    there."""
    what = f"looking up model {name!r}"
    model = lookup(lambda: client.get_registered_model(name), what)
    if model is None:
        return
    held = {k: model.tags[k] for k in KIND if k in model.tags}
    if not held and (versions := lookup(lambda: client.search_model_versions(f"name='{name}'"), what)):
        newest = max(versions, key=lambda v: int(v.version))
        held = {k: newest.tags[k] for k in KIND if k in newest.tags}
    if all(held.get(k, tags.get(k)) == tags.get(k) for k in KIND):
        return
    raise UserError(
        f"register: {name!r} holds models predicting {held.get('target')!r} ({held.get('task')}); this run predicts "
        f"{tags.get('target')!r} ({tags.get('task')}). One registered name holds one kind of model, so that the "
        f"champion gate compares like with like: register this one under its own name, -S register.model_name=auto "
        "(named after the data) or -S register.model_name=<name>, then rerun `trainflow stage register`."
    )


def flavor_of(version: Any) -> str:
    return str(version.tags.get(FLAVOR_TAG, "package"))


def version_of_run(client: Any, name: str, run_id: str, flavor: str = "package") -> Any | None:
    """The version of model `name` registered from run `run_id` as `flavor`, if any (the first, should there be
    several). One run holds its model once per flavour (register.flavor)."""
    versions = [v for v in client.search_model_versions(f"run_id='{run_id}'") if v.name == name]
    versions = [v for v in versions if flavor_of(v) == flavor]
    return min(versions, key=lambda v: int(v.version)) if versions else None


def version_of_model(client: Any, name: str, model_hash: str, flavor: str = "package") -> Any | None:
    """The version of model `name` holding the exported model with hash `model_hash` (MODEL_TAG) as `flavor`, if
    any."""
    found = client.search_model_versions(f"name='{name}' and tags.`{MODEL_TAG}` = '{model_hash}'")
    found = [v for v in found if flavor_of(v) == flavor]
    return min(found, key=lambda v: int(v.version)) if found else None


def register(
    model_uri: str,
    run_id: str,
    params: RegisterParams,
    metrics: dict[str, float],
    tags: dict[str, str],
    *,
    test_hash: str,
    rescore: Rescore,
    challenger: paired.Scored | None = None,
    seed: int = 0,
    slicing: paired.Slicing | None = None,
) -> dict[str, Any]:
    """Register the model of run `run_id` (`model_uri`) as a version of `params.model_name` (alias `challenger`); move
    `champion` to it only if it beats the champion on the same test data (hash `test_hash`): by `params.decide`,
    paired (`challenger`: this model's per-row outputs on the test split; the permutations seeded by `seed`) or point.

    Idempotent: a run registers at most one version. The version of `run_id` is looked up first, so a retry after a
    partial success (version created, then an error) completes that version's decision instead of creating another,
    and a rerun after the decision was recorded changes nothing and returns it. And one model is registered once: a
    run whose exported model (`tags[MODEL_TAG]`) is byte for byte a decided version's (a retrain that changed only
    how it ran: train.progress, an instant resume) registers nothing and returns that version.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    name = params.model_name
    gate = gate_metric(params, metrics)
    new = float(metrics[gate])
    if params.decide == "paired" and challenger is None:
        raise ValueError("register.decide: paired needs the challenger's per-row outputs")
    comparison: paired.Comparison | None = None
    all_tags = {**tags, TEST_HASH_TAG: test_hash, **{f"metric.{k}": repr(float(v)) for k, v in metrics.items()}}
    if slicing is not None:
        all_tags |= slicing.tags
    with registry_lock(mlflow.get_tracking_uri(), name):
        failpoint("register")
        flavor = tags.get(FLAVOR_TAG, "package")
        existing = version_of_run(client, name, run_id, flavor)
        if existing is None and MODEL_TAG in tags:
            same = lookup(
                lambda: version_of_model(client, name, tags[MODEL_TAG], flavor), f"looking up the versions of {name!r}"
            )
            if same is not None and DECISION_TAG in same.tags:
                lineage = {k: v for k, v in same.tags.items() if k in tags}  # the version's, not this run's
                why = f"no new version: run {run_id} exported byte for byte the model of version {same.version}"
                return _recorded(client, same, gate, lineage, test_hash, why)
        if existing is not None and DECISION_TAG in existing.tags:
            why = f"already registered as version {existing.version} by an earlier run of register"
            return _recorded(client, existing, gate, tags, test_hash, why)
        # Each file's sha256, kept in the registry, where the artifact store's writers cannot change it: trainflow's
        # loading checks the files against it (trainflow.artifacts.manifest).
        all_tags |= manifest.record(model_uri)
        if existing is None:
            check_kind(client, name, tags)
            version = int(mlflow.register_model(model_uri, name, tags=all_tags).version)
            if not any(k in client.get_registered_model(name).tags for k in KIND):  # the first version's kind
                for key in KIND:
                    if key in tags:
                        client.set_registered_model_tag(name, key, tags[key])
        else:  # created by an attempt that failed before deciding: decide now
            version = int(existing.version)
            for key, value in all_tags.items():
                client.set_model_version_tag(name, str(version), key, value)
        client.set_registered_model_alias(name, CHALLENGER, str(version))
        current = current_champion(client, name)
        previous: dict[str, float] | None = None
        rescored = False
        held: Held | None = None  # which test rows the champion's own split held (re-scored champions)
        keep: np.ndarray | None = None  # the rows compared, where some are left out
        tested = len(challenger.labels) if challenger is not None else 0
        what = f"re-scoring champion version {current.version} of {name!r} on the new test split" if current else ""
        if current is None:
            promoted, decision = True, f"version {version} is the first champion of {name}"
        elif int(current.version) == version:  # an interrupted attempt of this registration had set the alias
            promoted, decision = True, f"version {version} is the champion of {name} (set by an interrupted attempt)"
            current = None
        else:
            try:
                previous, rows = champion_metrics(current, gate, test_hash, rescore, params.decide == "paired")
                rescored = rows is not None
                # Re-scored on this test split: which of its rows the champion's own split trained or validated it
                # on (held), so those are left out; when that is unknown, or nothing is left, nothing is compared.
                held = held_rows(slicing, current, test_hash, len(rows.labels)) if rows is not None else None
                blind = held is not None and (held.clean is None or not held.clean.any())
                keep = None if held is None or blind or held.clean is None or held.clean.all() else held.clean
                if params.decide == "paired" and gate in previous and not blind:
                    assert challenger is not None and rows is not None
                    new_rows, old_rows = (_kept(s, keep) for s in (challenger, rows))
                    comparison = paired.compare(gate, new_rows, old_rows, params.confidence, seed)
                    if slicing is not None:
                        where = held.split if held is not None else None
                        where = where[keep] if where is not None and keep is not None else where
                        paired.sliced(comparison, new_rows, old_rows, slicing.masks(new_rows.labels, where))
            except Exception as exc:  # noqa: BLE001 - a champion that cannot be scored stays, and the decision says why
                # ... but only when the champion is what failed. An outage of the store its files come from, of the
                # registry (asked once more: an outage unavailable() does not recognise) or a full disk says nothing
                # about the champion: raised, so the rerun re-scores it instead of recording "stays" for good.
                if any(outage.unavailable(e) for e in _chain(exc)):
                    raise registry_failed(what, exc, RERUN_REGISTER) from exc
                if any(no_space(e) for e in _chain(exc)):
                    raise disk_full(
                        Path(tempfile.gettempdir()),  # where MLflow downloads the champion's files
                        exc,
                        "Nothing was decided; the champion alias is as it was.",
                        "Free space there, then rerun `trainflow stage register`.",
                    ) from exc
                lookup(lambda: client.get_registered_model(name), what)  # raises if the registry does not answer
                promoted = False
                decision = (
                    f"champion stays version {current.version}: it could not be re-scored on the new test split "
                    f"({type(exc).__name__}: {exc}); to promote version {version} anyway, run `trainflow models "
                    f"promote {version} --name {name} --reason ...` (it keeps the history a rollback needs)"
                )
            else:
                old = previous.get(gate)
                if old is None:
                    promoted = False
                    decision = (
                        f"champion stays version {current.version}: it has no {gate} on this test data (it predicts "
                        f"something else), so the two are not compared; to serve version {version} instead, run "
                        f"`trainflow models promote {version}`"
                    )
                elif blind and held is not None and rows is not None:
                    promoted = False
                    decision = unknown_rows(held, len(rows.labels), int(current.version), version, name)
                else:
                    if comparison is not None:
                        by_hand = f"`trainflow models promote {version} --name {name} --reason ...`"
                        promoted, why = paired.decide(comparison, params.promote_if, params.min_improvement, by_hand)
                        why = f"{why} (champion version {current.version})"
                    else:
                        new_at, old_at = new, old
                        if keep is not None:  # the point rule on the rows left too
                            assert challenger is not None and rows is not None
                            new_at, old_at = (paired.metric_value(gate, _kept(s, keep)) for s in (challenger, rows))
                        promoted = beats(new_at, old_at, gate, params.min_improvement)
                        on = "re-scored on the new test split" if rescored else "same test split"
                        verdict = "beats" if promoted else "does not beat"
                        why = (
                            f"{gate} {new_at:.6g} {verdict} champion version {current.version}'s {old_at:.6g} ({on}) "
                            f"by more than min_improvement {params.min_improvement:g}"
                        )
                    if keep is not None and held is not None:
                        why += f"; {left_out(held, keep)}"
                    then = f"champion moves to version {version}" if promoted else f"stays version {current.version}"
                    decision = f"{why}: {then}"
        if comparison is not None:
            for key, value in comparison.tags().items():
                client.set_model_version_tag(name, str(version), key, value)
        client.set_model_version_tag(name, str(version), AGAINST_TAG, str(current.version) if current else "none")
        if promoted:
            try:
                set_champion(client, name, version, f"register: {decision}")
            except NotAllowed as refused:  # the version stays challenger, and says why
                client.set_model_version_tag(name, str(version), DECISION_TAG, f"{decision}; not moved: {refused}")
                raise
        client.set_model_version_tag(name, str(version), DECISION_TAG, decision)
    return {
        "model_name": name,
        "version": version,
        "model_uri": f"models:/{name}/{version}",
        "gate_metric": gate,
        "value": new,
        "previous_champion": int(current.version) if current else None,
        "previous_value": previous.get(gate) if previous else None,  # None: the champion has no such metric
        "previous_metrics": previous,
        "rescored": rescored,
        "champion": promoted,
        "champion_version": version if promoted else (int(current.version) if current else None),
        "decision": decision,
        "decide": params.decide,
        "comparison": {**comparison.to_json(), **rows_record(held, keep, tested)} if comparison is not None else None,
        "test_rows": rows_record(held, keep, tested) if held is not None else None,
        "tags": {**tags, TEST_HASH_TAG: test_hash},
    }


def held_rows(slicing: paired.Slicing | None, champion: Any, test_hash: str, n: int) -> Held | None:
    """Which of the `n` rows of this test split `champion`'s own split held, and where (split.Held); None when nothing
    is recorded (no `slicing`). A champion tested on this very split (its TEST_HASH_TAG) was trained on none."""
    import numpy as np

    from trainflow.data.split import Held

    if slicing is None or slicing.held is None:
        return None
    held = slicing.held(dict(champion.tags))
    if champion.tags.get(TEST_HASH_TAG) == test_hash:
        return Held(held.split, np.ones(n, dtype=bool), "the champion was tested on this very test split")
    return held


def _kept(scored: paired.Scored, keep: np.ndarray | None) -> paired.Scored:
    return scored if keep is None else paired.Scored(scored.labels[keep], scored.outputs[keep])


def left_out(held: Held, keep: np.ndarray) -> str:
    """The decision's note on the test rows it left out."""
    n, k = len(keep), int(keep.sum())
    return (f"compared on {k} of the {n} test rows: {n - k} left out, as the champion trained or validated on them "
            f"({held.how})")  # fmt: skip


def rows_record(held: Held | None, keep: np.ndarray | None, n: int) -> dict[str, Any]:
    """registration.json's account of the `n` test rows: how many were compared, how many left out, and why."""
    if held is None:
        return {}
    compared = int(keep.sum()) if keep is not None else (n if held.clean is not None and held.clean.any() else 0)
    return {"test_rows": n, "compared": compared, "left_out": n - compared, "why": held.how}


def unknown_rows(held: Held, n: int, champion: int, version: int, name: str) -> str:
    """The decision when no test row is known to be clean of the champion's training: it stays, and how to move it."""
    if held.clean is None:
        why = f"which of these {n} test rows its own split trained or validated it on is not known ({held.how})"
    else:
        why = f"every one of these {n} test rows was in its train or val split ({held.how})"
    return (
        f"champion stays version {champion}: {why}; a model scored on rows it was trained on looks better than it is, "
        f"so the two are not compared (0 of the {n} test rows compared). To promote version {version} anyway, run "
        f"`trainflow models promote {version} --name {name} --reason ...`. Versions whose splits share an assignment "
        "are compared by the gate itself: keep split.seed and the other split settings as they are between versions "
        "(the top-level seed, the training seed, moves no row)"
    )


def _recorded(client: Any, existing: Any, gate: str, tags: dict[str, str], test_hash: str, why: str) -> dict[str, Any]:
    """registration.json for a model whose version was registered and decided before (by this run, or by another
    run of the same weights): the registry as it is now."""
    name, version = existing.name, int(existing.version)
    champion = current_champion(client, name)
    champion_version = int(champion.version) if champion is not None else None
    return {
        "model_name": name,
        "version": version,
        "model_uri": f"models:/{name}/{version}",
        "gate_metric": gate,
        "value": tagged_metrics(existing).get(gate),
        "previous_champion": None,
        "previous_value": None,
        "previous_metrics": None,
        "rescored": False,
        "champion": champion_version == version,
        "champion_version": champion_version,
        "decision": f"{why}, nothing changed (its decision then: {existing.tags[DECISION_TAG]})",
        "decide": None,
        "comparison": None,
        "test_rows": None,
        "tags": {**tags, TEST_HASH_TAG: test_hash},
    }


# --- the champion by hand: trainflow models list / promote / rollback -------------------------------------------------


def champion_history(client: Any, name: str) -> list[int]:
    """The versions that were champion, oldest first (the registered model's HISTORY_TAG)."""
    import json

    tags = client.get_registered_model(name).tags
    return [int(v) for v in json.loads(tags.get(HISTORY_TAG, "[]"))]


class NotAllowed(UserError):
    """The registry refused this user something (a server with access control): nothing was changed. Raised after the
    stages ran, so params.yaml keeps a run's -S overrides (DVC recorded the stages with them)."""

    params_in_question = False


def _user() -> str:
    import os

    return os.environ.get("MLFLOW_TRACKING_USERNAME", "this user")


def set_champion(client: Any, name: str, version: int, why: str) -> None:
    """Point `champion` at `version`, append it to the history, and tag it with why. Call under registry_lock. The
    alias moves first: when the registry refuses it (NotAllowed), nothing else was written."""
    import json
    from datetime import datetime

    from mlflow.exceptions import MlflowException

    try:
        client.set_registered_model_alias(name, CHAMPION, str(version))
    except MlflowException as exc:
        if exc.error_code != "PERMISSION_DENIED":
            raise
        raise NotAllowed(
            f"the registry refused to move `champion` of {name!r} to version {version} for {_user()} ({exc.message}); "
            f"version {version} stays `challenger`. A user allowed to move it runs `trainflow models promote "
            f"{version} --name {name} --reason ...`"
        ) from None
    history = [v for v in champion_history(client, name) if v != version] + [version]
    client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))
    when = datetime.now(UTC).isoformat(timespec="seconds")
    client.set_model_version_tag(name, str(version), CHANGE_TAG, f"{when} {why}")


def _client_and_model(name: str) -> Any:
    """A client, once the registry has answered that model `name` exists (a UserError if it answers that it does not,
    a ServiceError if it does not answer)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    if lookup(lambda: client.get_registered_model(name), f"looking up model {name!r}", RERUN_MODELS) is None:
        known = [m["name"] for m in registered_models(client)]
        held = f"it holds {', '.join(map(repr, known))}" if known else "it holds no registered model yet"
        raise UserError(
            f"no registered model {name!r} in the tracking store {mlflow.get_tracking_uri()} ({held}); register one "
            "first (`trainflow run`), or name another with --name (`trainflow models list --all` lists them)"
        )
    return client


def registered_models(client: Any = None) -> list[dict[str, Any]]:
    """Every registered model in the store, by name: how many versions, the newest, the champion, and what it
    predicts (the KIND tags). For `trainflow models list --all` and for naming the models a mistyped --name missed."""
    from mlflow.tracking import MlflowClient

    client = client or MlflowClient()
    found = lookup(lambda: list(_every_page(client.search_registered_models)), "listing the registered models",
                   RERUN_MODELS)  # fmt: skip
    out = []
    for model in sorted((m for m in found or [] if not is_lock(m.name)), key=lambda m: m.name):
        search = functools.partial(client.search_model_versions, f"name='{model.name}'")
        versions = lookup(search, "listing versions", RERUN_MODELS) or []
        out.append(
            {
                "name": model.name,
                "versions": len(versions),
                "newest": max((int(v.version) for v in versions), default=None),
                "champion": int(model.aliases[CHAMPION]) if CHAMPION in (model.aliases or {}) else None,
                "target": model.tags.get("target", ""),
                "task": model.tags.get("task", ""),
            }
        )
    return out


def _every_page(search: Callable[..., Any]) -> Iterator[Any]:
    """Every result of an MLflow search that pages its answers (max_results per page, a token for the next)."""
    token = None
    while True:
        page = search(max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def list_versions(name: str) -> list[dict[str, Any]]:
    """Every version of `name`, newest first: aliases, test metrics, data hash, run, how it became champion."""
    client = _client_and_model(name)
    aliases: dict[int, list[str]] = {}
    for alias, v in client.get_registered_model(name).aliases.items():
        aliases.setdefault(int(v), []).append(alias)
    out = []
    for v in sorted(client.search_model_versions(f"name='{name}'"), key=lambda v: -int(v.version)):
        out.append(
            {
                "version": int(v.version),
                "aliases": sorted(aliases.get(int(v.version), [])),
                "metrics": tagged_metrics(v),
                "target": v.tags.get("target", ""),
                "task": v.tags.get("task", ""),
                "data_hash": v.tags.get("data_hash", ""),
                "run_id": v.run_id,
                "created": v.creation_timestamp,
                "champion_change": v.tags.get(CHANGE_TAG, ""),
            }
        )
    return out


def promote(name: str, version: int, reason: str) -> dict[str, Any]:
    """Make `version` the champion by hand, whatever the gate says; recorded with `reason`."""
    import mlflow

    client = _client_and_model(name)
    what = f"looking up version {version} of {name!r}"
    if lookup(lambda: client.get_model_version(name, str(version)), what, RERUN_MODELS) is None:
        raise UserError(f"{name} has no version {version}; `trainflow models list` shows them")
    with registry_lock(mlflow.get_tracking_uri(), name):
        before = current_champion(client, name, RERUN_MODELS)
        set_champion(client, name, version, f"promoted by hand (trainflow models promote): {reason}")
    return {"model_name": name, "champion": version, "previous_champion": int(before.version) if before else None}


def rollback(name: str, reason: str) -> dict[str, Any]:
    """Give `champion` back to the version that held it before the current one; recorded with `reason`."""
    import json

    import mlflow

    client = _client_and_model(name)
    with registry_lock(mlflow.get_tracking_uri(), name):
        current = current_champion(client, name, RERUN_MODELS)
        if current is None:
            raise UserError(f"{name} has no champion to roll back; `trainflow models promote VERSION` sets one")
        history = [v for v in champion_history(client, name) if v != int(current.version)]
        if not history:
            raise UserError(
                f"{name}: version {current.version} is the only champion it has had; nothing to roll back to "
                "(`trainflow models promote VERSION` makes another version champion)"
            )
        previous = history[-1]
        client.set_registered_model_alias(name, CHAMPION, str(previous))
        client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))
        from datetime import datetime

        when = datetime.now(UTC).isoformat(timespec="seconds")
        why = f"{when} rolled back to from version {current.version} (trainflow models rollback): {reason}"
        client.set_model_version_tag(name, str(previous), CHANGE_TAG, why)
        client.set_model_version_tag(name, current.version, "rolled_back", f"{when} {reason}")
    return {"model_name": name, "champion": previous, "previous_champion": int(current.version)}
