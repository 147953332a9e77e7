"""`trainflow verify MODEL`: prove that a registered version reproduces from its lineage (issue 27, item 5).

A version is tagged with the git commit it was trained from, DVC's hash of the splits it was trained on and the hash
of the exported model. Verify takes exactly those: the code and params.yaml of the commit (`git archive`, into a
temporary folder), the splits out of the DVC cache by their hash (fetched from the default DVC remote first when the
cache lacks them; each file's bytes checked against its md5, so a damaged cache is named, not trained on), then runs
the train stage there with a throwaway MLflow store and compares the exported model's hash (and the test metrics of
the evaluate stage) with the version's, and tags the version `verified` with the answer. Training is bit-exact on a
CPU (and on one GPU with train.deterministic), so a match proves the lineage; a mismatch names what differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from trainflow.errors import DataError, UserError

REFETCH = "delete that file and run `dvc pull data/splits` (or `dvc fetch`) to get it back from the DVC remote"


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

    from trainflow import registry

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


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    """Copy the splits DVC hashed as `dir_hash` (an md5 ending in .dir) from the project's cache into `dest`, each
    file checked against its md5; fetched from the DVC remote first when the cache lacks them (with `commit`). The
    file names restored."""
    cache = root / ".dvc" / "cache" / "files" / "md5"
    listing = cache / dir_hash[:2] / dir_hash[2:]
    if commit is not None and not _cached(cache, dir_hash):
        fetch_splits(root, commit)
    if not listing.is_file():
        raise DataError(
            f"verify: the splits it was trained on (DVC hash {dir_hash}) are not in {cache.parent.parent}, nor on "
            "the default DVC remote; push them from a machine that has them (`dvc push data/splits`), or add the "
            "remote that holds them (`dvc remote add -d NAME URL`), then verify again"
        )
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for entry in json.loads(listing.read_text()):
        name, md5 = entry["relpath"], entry["md5"]
        cached = cache / md5[:2] / md5[2:]
        if not cached.is_file():
            raise DataError(f"verify: data/splits/{name} (md5 {md5}) is not in the DVC cache; run `dvc pull`")
        if (actual := _md5(cached)) != md5:
            raise DataError(
                f"verify: data/splits/{name} in the DVC cache ({cached}) is damaged: its md5 is {actual}, DVC "
                f"recorded {md5}; {REFETCH}"
            )
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, dest / name)
        names.append(name)
    return names


def verify(model: str, root: Path) -> dict[str, Any]:
    """Retrain `model`'s version from its commit, params and data; whether its exported model comes out the same."""
    from trainflow import registry, tracking

    version = version_of(model)
    tags = version.tags
    missing = [t for t in ("git_commit", "data_hash", registry.MODEL_TAG) if tags.get(t) in (None, "", "unknown")]
    if missing:
        raise UserError(f"verify {model}: version {version.version} has no {', '.join(missing)} tag: it cannot be "
                        "reproduced (registered outside a git checkout, or by an older trainflow)")  # fmt: skip
    if tags.get("git_dirty") == "true":
        raise UserError(f"verify {model}: version {version.version} was trained from uncommitted changes to "
                        f"{tags['git_commit'][:12]}; what it was trained from is not in git")  # fmt: skip
    commit = tags["git_commit"]
    with tempfile.TemporaryDirectory(prefix="trainflow-verify-") as tmp:
        checkout = Path(tmp) / "project"
        checkout.mkdir()
        archive = subprocess.run(["git", "archive", commit], cwd=root, capture_output=True)
        if archive.returncode != 0:
            why = archive.stderr.decode().strip()
            raise UserError(f"verify {model}: commit {commit[:12]} is not in this clone ({why}); `git fetch` it, then "
                            "verify again")  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(checkout)], input=archive.stdout, check=True)
        restore_splits(root, tags["data_hash"], checkout / "data" / "splits", commit)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "MLFLOW_TRACKING_URI": f"sqlite:///{Path(tmp) / 'mlflow.db'}",
        }
        env.pop("TRAINFLOW_FAILPOINT", None)
        print(f"verify: retraining version {version.version} of {version.name} from commit {commit[:12]} and its "
              f"data ({tags['data_hash']})", file=sys.stderr)  # fmt: skip
        cli = "import sys; from trainflow.cli import main; sys.exit(main())"
        for stage in ("train", "evaluate"):
            done = subprocess.run(
                [sys.executable, "-c", cli, "stage", stage, "-S", "train.progress=false"],
                cwd=checkout,
                env=env,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                tail = "\n".join(done.stderr.strip().splitlines()[-15:])
                raise UserError(f"verify {model}: the {stage} stage of commit {commit[:12]} failed:\n{tail}")
        got = tracking.model_hash(checkout / "models" / "final")
        metrics = json.loads((checkout / "reports" / "metrics.json").read_text())
    expected = tags[registry.MODEL_TAG]
    recorded = registry.tagged_metrics(version)
    differ = sorted(k for k, v in recorded.items() if k in metrics and float(metrics[k]) != v)
    what = [] if got == expected else ["the exported model (weights, config or preprocessing)"]
    what += [f"test metrics {', '.join(differ)}"] if differ else []
    verified = not what
    from mlflow.tracking import MlflowClient

    stamp = f"{'true' if verified else 'false'}: retrained from {commit[:12]} and data {tags['data_hash']}"
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
        "verified": verified,
    }
