"""A registered version's manifest: the sha256 of each of its files in the artifact store (MLmodel included), kept in
the registry's tags, and checked before anything of the version is read, imported or unpickled.

Why the registry: it and the artifact store (mlartifacts/, S3, ...) are two trust domains. Whoever can write files
into the store can set `code: code` in MLmodel and plant `code/trainflow/serving.py`, which MLflow's own loading then
imports; a tag of the version can be changed only through the registry. So the files are fetched into a fresh local
folder (never read in place: a local store would be read where its writers can still change it), hashed there, and
refused unless they are, file for file, what the registry recorded at registration.

What this protects is loading through trainflow: `trainflow predict`, `trainflow.serving.load` and
`trainflow.serving.download`. A bare `mlflow.pyfunc.load_model` reads MLmodel before anything of ours runs, and a
registry in the wrong hands can rewrite the manifest too.

The manifest is JSON (path -> sha256, sorted) cut into tags of PART_CHARS characters, with a head tag holding the
number of parts and the hash of the whole text, so a manifest that lost a part is told apart from a changed file.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainflow.core.errors import UserError

HEAD_TAG = "artifact_manifest"  # {"parts": n, "files": n, "sha256": of the whole manifest text}
# MLflow 3 takes 100,000 characters per model version tag; MLflow 2's servers 5,000 (a varchar(5000) column in their
# databases): a registry served by either holds parts of this size.
PART_CHARS = 5000
# What MLflow writes beside a registered model's files when it downloads them (its name and version): not stored
# with the version, and overwritten by MLflow on every download, so what the store holds under that name never
# reaches the loader.
DOWNLOAD_NOTE = "registered_model_meta"
LISTED = 8  # files named per kind of change before "... (N more)"


def part_tag(i: int) -> str:
    return f"{HEAD_TAG}.{i}"


def files(directory: Path) -> dict[str, str]:
    """Every file under `directory` (relative POSIX path -> sha256), sorted, MLflow's download note aside."""
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel == DOWNLOAD_NOTE:
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        out[rel] = h.hexdigest()
    return out


def tags(directory: Path) -> dict[str, str]:
    """The version tags that record the files of `directory` (a registered model's folder, as downloaded)."""
    listed = files(directory)
    text = json.dumps(listed, sort_keys=True, separators=(",", ":"))  # ASCII: a character is a byte
    parts = [text[i : i + PART_CHARS] for i in range(0, len(text), PART_CHARS)] or [""]
    head = {"parts": len(parts), "files": len(listed), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    return {HEAD_TAG: json.dumps(head, sort_keys=True), **{part_tag(i): p for i, p in enumerate(parts)}}


def record(model_uri: str) -> dict[str, str]:
    """The manifest tags of the model at `model_uri` (what a version registered from it will hold), from a fresh
    download of its files. Registration calls it right after the model was logged, before it registers or decides
    anything: a store that does not answer, or a full disk, leaves nothing half-done for the rerun."""
    import mlflow

    from trainflow.core import outage
    from trainflow.core.errors import ServiceError
    from trainflow.core.io import disk_full, no_space

    try:
        with tempfile.TemporaryDirectory(prefix="trainflow-manifest-") as tmp:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp))
            return tags(local)
    except Exception as exc:
        nothing = "Nothing was decided and no version registered."
        if no_space(exc):  # where MLflow downloads the files
            rerun = "Free space there, then rerun `trainflow stage register`."
            raise disk_full(Path(tempfile.gettempdir()), exc, nothing, rerun) from exc
        if outage.unavailable(exc):
            raise ServiceError(
                f"register: reading the files of {model_uri} to record their sha256 in the registry: the artifact "
                f"store did not answer ({type(exc).__name__}: {exc}). {nothing} Rerun `trainflow stage register` once "
                "it answers."
            ) from exc
        raise


def recorded(version_tags: Mapping[str, str], what: str) -> dict[str, str] | None:
    """The manifest held by a version's tags; None when it has none (registered before trainflow recorded them)."""
    if HEAD_TAG not in version_tags:
        if part_tag(0) in version_tags:  # the head is tagged first: parts without it are a cut-off registration
            raise UserError(_incomplete(what))
        return None
    head = json.loads(version_tags[HEAD_TAG])
    text = "".join(version_tags.get(part_tag(i), "") for i in range(int(head["parts"])))
    if hashlib.sha256(text.encode()).hexdigest() != head["sha256"]:
        raise UserError(_incomplete(what))
    return dict(json.loads(text))


def _incomplete(what: str) -> str:
    return (
        f"{what}: the registry's manifest of its files (the version tags {HEAD_TAG}.*) is incomplete, so nothing "
        "can show its files are the registered ones; nothing was loaded. A registration cut off while tagging leaves "
        "it so: rerun `trainflow stage register` in the project that registered it"
    )


def check(directory: Path, manifest: Mapping[str, str], what: str, store: str) -> None:
    """Refuse the files of `directory` unless they are those of `manifest`: name each file changed, added or
    missing."""
    found = files(directory)
    changed = sorted(p for p in found.keys() & manifest.keys() if found[p] != manifest[p])
    added = sorted(found.keys() - manifest.keys())
    missing = sorted(manifest.keys() - found.keys())
    if not (changed or added or missing):
        return

    def listed(kind: str, names: list[str]) -> str:
        more = f", ... ({len(names) - LISTED} more)" if len(names) > LISTED else ""
        return f"{kind}: {', '.join(names[:LISTED])}{more}"

    differences = "; ".join(listed(k, v) for k, v in (("changed", changed), ("added", added), ("missing", missing))
                            if v)  # fmt: skip
    raise UserError(
        f"{what}: its files in the artifact store ({store}) are not the ones registered ({differences}), by the "
        f"sha256 of each that the registry recorded (version tags {HEAD_TAG}.*). Nothing of it was loaded or run. "
        "Someone or something wrote to the artifact store after registration: restore the version's files from a "
        "backup of the store (the tags give each file's sha256), or serve another version (`trainflow models "
        "rollback`, `trainflow models promote VERSION`)"
    )


def registered_version(client: Any, model: str) -> tuple[str, str] | None:
    """(name, version) of a registry URI (models:/<name>@<alias>, models:/<name>/<version>, models:/<name>/latest);
    None for a URI of no registered version (runs:/..., models:/<logged model id>)."""
    if not model.startswith("models:/"):
        return None
    from mlflow.store.artifact.utils.models import get_model_name_and_version

    found = get_model_name_and_version(client, model)
    return (str(found[0]), str(found[1])) if len(found) == 2 else None


def fetch(model: str) -> tuple[Path, tuple[str, str] | None, bool]:
    """The files of the model at MLflow URI `model`, downloaded into a fresh folder (removed when the process ends):
    (that folder, the registered version (name, number) or None, whether they were checked against its manifest).

    A registered version is pinned to its number first, so an alias that moves meanwhile cannot pair one version's
    files with another's manifest. Its files are checked (`check`); a version without a manifest (registered before
    trainflow recorded them) and a URI of no registered version are fetched unchecked."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    manifest = None
    try:
        version = registered_version(client, model)
        uri = model
        if version is not None:
            name, number = version
            what = f"model {model} (version {number} of {name!r})"
            manifest = recorded(client.get_model_version(name, number).tags, what)
            uri = f"models:/{name}/{number}"
            store = client.get_model_version_download_uri(name, number)
        folder = tempfile.mkdtemp(prefix="trainflow-model-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=folder))
    except MlflowException as exc:
        raise UserError(f"--model {model}: {exc.message} (tracking URI {mlflow.get_tracking_uri()})") from None
    if manifest is not None:
        check(local, manifest, what, store)
    return local, version, manifest is not None


def unchecked(version: tuple[str, str] | None) -> str:
    """Why no manifest vouches for a model's files: its registered version (name, number) predates them, or it is
    not a registered version."""
    if version is not None:
        return f"version {version[1]} of {version[0]!r} was registered before trainflow recorded manifests"
    return "it is not a registered version (a run's or a logged model's URI), so the registry holds no manifest of it"


def warn_unchecked(model: str, version: tuple[str, str] | None) -> None:
    """What `trainflow predict` says when it reads a model whose files no manifest vouches for."""
    print(
        f"trainflow: model {model}: its files were not checked against the registry ({unchecked(version)}); they are "
        "read as data, and nothing stored with them is imported or run",
        file=sys.stderr,
    )
