"""`trainflow verify MODEL`: prove that a registered version reproduces from its lineage.

A version is tagged with the git commit it was trained from and whether its code differed from it (`code_dirty`), the
resolved params it was trained with (`params`, hashed as `params_hash`), DVC's hash of the splits it was trained on
(`data_hash`; register keeps them in the DVC cache) and their sha256 as training read them (`data_sha256`), the
environment (`env.*`) and the hash of the exported model. Verify takes exactly those: the commit's code (`git
archive`, into a temporary folder) with the recorded params as its params.yaml (checked: the commit's own code resolves
them to the version's params_hash), the splits out of the DVC cache by their hash (fetched from the default DVC remote
first when the cache lacks them, else taken from the workspace's data/splits where those are the same bytes; each file
checked against its md5, so a damaged cache is named, not trained on, then the whole against data_sha256), runs the
train and evaluate stages there with a throwaway MLflow store, compares the exported model's hash and the test metrics
with the version's, and tags the version `verified` with the answer. Training is bit-exact on a CPU (and on one GPU
with train.deterministic), so a match proves the lineage. Data, code and params are checked before the retraining, so
a mismatch after it is named by what is left: the environment, where it differs from the one recorded.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from trainflow.core.errors import DataError, UserError
from trainflow.registry import lineage

REFETCH = (
    "delete that file and verify again: verify fetches it from the DVC remote, or takes it from data/splits where "
    "that holds the same bytes"
)
CLI = "import sys; from trainflow.cli import main; sys.exit(main())"  # the checkout's trainflow, not this one


def resolve(model: str) -> tuple[str, str]:
    """(name, alias or version) of `model`: name@alias, name/version, or the same with models:/ in front."""
    ref = model.removeprefix("models:/")
    if "@" in ref:
        name, _, which = ref.partition("@")
    elif "/" in ref:
        name, _, which = ref.rpartition("/")
    else:
        raise UserError(f"verify {model}: name a version, as NAME@champion, NAME@challenger or NAME/3")
    if not name or not which:
        raise UserError(f"verify {model}: name a version, as NAME@champion, NAME@challenger or NAME/3")
    return name, which


def version_of(model: str) -> Any:
    """The registry's model version `model` names (name@alias, name/version, models:/...)."""
    from mlflow.tracking import MlflowClient

    from trainflow.registry import registry

    name, which = resolve(model)
    client = MlflowClient()
    what = f"looking up {model}"
    if which.isdigit():
        found = registry.lookup(lambda: client.get_model_version(name, which), what)
    else:
        found = registry.lookup(lambda: client.get_model_version_by_alias(name, which), what)
    if found is None:
        raise UserError(f"{model}: no such version in the registry (`trainflow models list --name {name}`)")
    return found


def _cached(cache: Path, dir_hash: str) -> bool:
    """Whether the cache holds the listing of `dir_hash` and every file it names."""
    listing = cache / dir_hash[:2] / dir_hash[2:]
    if not listing.is_file():
        return False
    return all((cache / e["md5"][:2] / e["md5"][2:]).is_file() for e in json.loads(listing.read_text()))


def fetch_splits(root: Path, commit: str) -> None:
    """`dvc fetch data/splits` of `commit` (its dvc.lock) and of the workspace, from the default remote into the
    project's cache; what cannot be fetched is left for restore_splits to name."""
    from dvc.repo import Repo

    print(f"verify: fetching the splits of {commit[:12]} from the DVC remote", file=sys.stderr)
    try:
        with Repo(str(root)) as repo:
            repo.fetch(targets=["data/splits"], revs=[commit], workspace=True)
    except Exception as exc:  # noqa: BLE001 - no remote, unreachable, or the commit has no such output: said below
        print(f"verify: could not fetch them ({exc})", file=sys.stderr)


def restore_splits(root: Path, dir_hash: str, dest: Path, commit: str | None = None) -> list[str]:
    """Copy the splits DVC hashed as `dir_hash` (an md5 ending in .dir) into `dest`, each file checked against its
    md5: out of the project's cache, fetched from the DVC remote first when the cache lacks them (with `commit`); a
    file still missing from the cache is taken from the workspace's data/splits when its bytes are the same (splits
    that no `dvc commit` stored). The file names restored."""
    cache = lineage.dvc_cache(root)
    listing = cache / dir_hash[:2] / dir_hash[2:]
    if commit is not None and not _cached(cache, dir_hash):
        fetch_splits(root, commit)
    workspace = root / "data" / "splits"
    if listing.is_file():
        entries = json.loads(listing.read_text())
    elif (here := lineage.dvc_dir_hash(workspace))[0] == dir_hash:
        entries = here[1]
    else:
        raise DataError(
            f"verify: the splits it was trained on (DVC hash {dir_hash}) are not in {cache.parent.parent}, nor on "
            "the default DVC remote, nor in data/splits; push them from a machine that has them (`dvc push "
            "data/splits`), or add the remote that holds them (`dvc remote add -d NAME URL`), then verify again"
        )
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for entry in entries:
        name, md5 = entry["relpath"], entry["md5"]
        source = cache / md5[:2] / md5[2:]
        if source.is_file():
            if (actual := lineage.file_md5(source)) != md5:
                raise DataError(
                    f"verify: data/splits/{name} in the DVC cache ({source}) is damaged: its md5 is {actual}, DVC "
                    f"recorded {md5}; {REFETCH}"
                )
        elif (workspace / name).is_file() and lineage.file_md5(workspace / name) == md5:
            source = workspace / name
        else:
            raise DataError(
                f"verify: data/splits/{name} (md5 {md5}) is neither in the DVC cache nor in data/splits; run `dvc pull`"
            )
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest / name)
        names.append(name)
    return names


def code_refusal(model: str, version: Any) -> str | None:
    """Why `version` cannot be retrained from its commit's code, and how to make it verifiable; None when it can.
    code_dirty says whether the code differed from the commit; a version without it (an older trainflow) has
    git_dirty alone, which params.yaml changed by -S also set."""
    tags = version.tags
    if "code_dirty" in tags:
        if tags["code_dirty"] == "false":
            return None
        older = ""
    elif tags.get("git_dirty") != "true":
        return None
    else:
        older = " (or in params.yaml: it was registered by an older trainflow, which did not tell them apart)"
    files = json.loads(tags.get("code_changes") or "[]")
    named = f": {', '.join(files)}" if files else ""
    ref = f"{version.name}/{version.version}"
    return (
        f"verify {model}: version {version.version} was trained from uncommitted changes to commit "
        f"{tags['git_commit'][:12]}{older}{named}; what it was trained from is not in git. To verify it, commit those "
        f"files as they were when it was trained (`git commit`), then run `trainflow verify {ref} --commit HEAD`: it "
        "retrains the version from that commit"
    )


def run_cli(checkout: Path, env: dict[str, str], args: list[str], what: str) -> str:
    """`trainflow ARGS` of the checkout (its own code), in it; stdout. A failure names `what` and ends with the
    last 15 lines of its errors."""
    done = subprocess.run([sys.executable, "-c", CLI, *args], cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise UserError(f"{what} failed:\n{tail}")
    return done.stdout


def check_params(model: str, version: Any, checkout: Path, env: dict[str, str], commit: str) -> None:
    """Write the params recorded with `version` as the checkout's params.yaml (a version registered without them
    keeps the commit's), and check that the commit's code resolves them to the version's params_hash."""
    import yaml

    tags = version.tags
    recorded = tags.get("params")
    if recorded is not None:
        (checkout / "params.yaml").write_text(yaml.safe_dump(json.loads(recorded), sort_keys=False))
    expected = tags.get("params_hash")
    resolved = run_cli(checkout, env, ["params", "check"], f"verify {model}: `trainflow params check` of commit "
                       f"{commit[:12]}")  # fmt: skip
    got = lineage.params_hash(json.loads(resolved))
    if not expected or got == expected:
        return
    if recorded is None:
        raise UserError(
            f"verify {model}: version {version.version} was registered without its params (by an older trainflow), "
            f"and params.yaml of commit {commit[:12]} is not what it was trained with (params_hash {got}, the "
            f"version's {expected}). Where params.yaml still holds the params it was trained with, commit it and run "
            f"`trainflow verify {version.name}/{version.version} --commit HEAD`"
        )
    raise UserError(
        f"verify {model}: the params recorded with version {version.version} resolve to params_hash {got} under the "
        f"code of commit {commit[:12]}, not to the version's {expected}: that code reads them otherwise than the code "
        "that trained it"
    )


def check_data(model: str, version: Any, checkout: Path, restored: list[str]) -> None:
    """The restored splits, hashed as training hashes them, against the version's data_sha256 (what its training
    read): a data_hash that names other splits is said before anything is retrained on them."""
    from trainflow.core.paths import Paths
    from trainflow.engine.fingerprint import data_hash

    expected = version.tags.get("data_sha256")
    if not expected:
        return
    try:
        got = data_hash(Paths(checkout))
    except OSError as exc:
        got = f"unreadable ({exc})"
    if got != expected:
        raise DataError(
            f"verify {model}: the splits DVC hash {version.tags['data_hash']} names ({', '.join(restored)}) are not "
            f"those version {version.version} was trained on: hashed as training hashes them they give {got[:16]}, "
            f"the version's data_sha256 is {expected[:16]}. Its data_hash tag names other splits than it was trained "
            "on (an older trainflow tagged dvc.lock's hash, which `trainflow stage` does not update): it cannot be "
            "verified"
        )


def environment_differs(version: Any, device: str) -> list[str] | None:
    """The `env.*` tags of `version` that differ here (`device`: what the retraining ran on), as "KEY: THEN when
    trained, NOW here"; None when the version has none (an older trainflow)."""
    recorded = {k: v for k, v in version.tags.items() if k.startswith("env.")}
    if not recorded:
        return None
    here = lineage.environment(device)
    return [
        f"{k}: {v} when trained, {here.get(k, 'unknown')} here" for k, v in sorted(recorded.items()) if here.get(k) != v
    ]


def same(a: float, b: float) -> bool:
    """Metrics computed from the same bytes are the same floats (tags hold repr's round trip): exactly equal, or
    both NaN (a metric undefined on these rows)."""
    return a == b or (math.isnan(a) and math.isnan(b))


def verify(model: str, root: Path, commit: str | None = None) -> dict[str, Any]:
    """Retrain `model`'s version from its commit (or `commit`: a commit holding the code it was trained from, when
    that was not committed), params and data; whether its exported model comes out the same."""
    from trainflow import tracking
    from trainflow.registry import registry

    version = version_of(model)
    tags = version.tags
    missing = [t for t in ("git_commit", "data_hash", registry.MODEL_TAG) if tags.get(t) in (None, "", "unknown")]
    if missing:
        raise UserError(f"verify {model}: version {version.version} has no {', '.join(missing)} tag: it cannot be "
                        "reproduced (registered outside a git checkout, or by an older trainflow)")  # fmt: skip
    if commit is None:
        if (refusal := code_refusal(model, version)) is not None:
            raise UserError(refusal)
        commit = tags["git_commit"]
    with tempfile.TemporaryDirectory(prefix="trainflow-verify-") as tmp:
        checkout = Path(tmp) / "project"
        checkout.mkdir()
        archive = subprocess.run(["git", "archive", commit], cwd=root, capture_output=True)
        if archive.returncode != 0:
            why = archive.stderr.decode().strip()
            raise UserError(f"verify {model}: commit {commit[:12]} is not in this clone ({why}); `git fetch` it, then "
                            "verify again")  # fmt: skip
        commit = subprocess.run(
            ["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        subprocess.run(["tar", "-x", "-C", str(checkout)], input=archive.stdout, check=True)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "MLFLOW_TRACKING_URI": f"sqlite:///{Path(tmp) / 'mlflow.db'}",
        }
        env.pop("TRAINFLOW_FAILPOINT", None)
        check_params(model, version, checkout, env, commit)
        restored = restore_splits(root, tags["data_hash"], checkout / "data" / "splits", commit)
        check_data(model, version, checkout, restored)
        print(f"verify: retraining version {version.version} of {version.name} from commit {commit[:12]} and its "
              f"data ({tags['data_hash']})", file=sys.stderr)  # fmt: skip
        for stage in ("train", "evaluate"):
            run_cli(checkout, env, ["stage", stage, "-S", "train.progress=false"],
                    f"verify {model}: the {stage} stage of commit {commit[:12]}")  # fmt: skip
        got = tracking.model_hash(checkout / "models" / "final")
        metrics = json.loads((checkout / "reports" / "metrics.json").read_text())
        training = checkout / "models" / "final" / "training.json"
        device = str(json.loads(training.read_text()).get("device", "unknown")) if training.is_file() else "unknown"
    expected = tags[registry.MODEL_TAG]
    recorded = registry.tagged_metrics(version)
    differ = sorted(k for k, v in recorded.items() if k in metrics and not same(float(metrics[k]), v))
    what = [] if got == expected else ["the exported model (weights, config or preprocessing)"]
    what += [f"test metrics {', '.join(differ)}"] if differ else []
    verified = not what
    from mlflow.tracking import MlflowClient

    given = "" if commit == tags["git_commit"] else f" (the version's own commit: {tags['git_commit'][:12]})"
    stamp = f"{'true' if verified else 'false'}: retrained from {commit[:12]}{given} and data {tags['data_hash']}"
    stamp += "; byte for byte the same model and test metrics" if verified else f"; differs: {'; '.join(what)}"
    client = MlflowClient()
    registry.lookup(lambda: client.set_model_version_tag(version.name, version.version, "verified", stamp), "tagging")
    return {
        "model": f"models:/{version.name}/{version.version}",
        "git_commit": commit,
        "data_hash": tags["data_hash"],
        "model_sha256": expected,
        "retrained_sha256": got,
        "metrics_differ": differ,
        "environment_differs": None if verified else environment_differs(version, device),
        "verified": verified,
    }
