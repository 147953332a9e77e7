"""Why this run ran: what changed since the champion it would replace.

Three things make a model: the data, the params, the code. Each registered version is tagged with what it was made
from (`data_files`: rows and content hash of each source file, which ingest records in data/processed/sources.json;
its MLflow run's params; `git_commit`), so a later run can say, against the champion: which files gained or lost
rows, which params changed (old -> new), which files of the code changed (git) — or that nothing did (a scheduled
retrain on the same data). The answer goes into registration.json, the training run's MLflow tags and the flow run's
registry artifact.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

SOURCES = "sources.json"  # in data/processed: what ingest read
DATA_TAG = "data_files"  # version tag: {file: [rows, sha256 prefix]} (compact JSON), or a digest when too long
TAG_LIMIT = 4500  # MLflow keeps 5000 characters of a version tag's value
# The code that makes a model besides data and params: the package, and a user's model module in the project root
# (model.code); not tests, benches or flows.
CODE_PATHS = ("trainflow", ":(glob)*.py")
LISTED = 20


def data_files(
    files: list[str], rows: list[int], paths: list[Path], group_by_folder: bool, known: dict[Path, str] | None = None
) -> dict[str, Any]:
    """Per source file (shown as the user names it): its rows (`rows`, per file) and the sha256 of its bytes (from
    `known` where the reader hashed the file as it read it). An image folder has a file per row: it is summarised per
    class folder (rows = images, the hash over the folder's files)."""
    out: dict[str, dict[str, Any]] = {}
    for name, path, n in zip(files, paths, rows, strict=True):
        key = str(Path(name).parent) + "/" if group_by_folder else name
        entry = out.setdefault(key, {"rows": 0, "sha256": hashlib.sha256()})
        entry["rows"] += n
        if not group_by_folder and known and path in known:
            entry["sha256"] = known[path]
            continue
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                entry["sha256"].update(block)
    digest = {k: v["sha256"] if isinstance(v["sha256"], str) else v["sha256"].hexdigest() for k, v in out.items()}
    return {k: {"rows": v["rows"], "sha256": digest[k]} for k, v in sorted(out.items())}


def data_tag(files: dict[str, Any]) -> str:
    """The version tag of `files`: {file: [rows, first 12 hex of its sha256]}, or, past the tag's length limit, the
    count and one digest (then a later run can say whether the data changed, not which file)."""
    compact = json.dumps({k: [v["rows"], v["sha256"][:12]] for k, v in files.items()}, separators=(",", ":"))
    if len(compact) <= TAG_LIMIT:
        return compact
    digest = hashlib.sha256(compact.encode()).hexdigest()[:16]
    return json.dumps({"files": len(files), "rows": sum(v["rows"] for v in files.values()), "digest": digest})


def _data_changes(then_tag: str | None, now: dict[str, Any]) -> list[str] | None:
    """Sentences on how the data changed since `then_tag` (a DATA_TAG); [] when it did not; None when unknown."""
    if then_tag is None:
        return None
    then = json.loads(then_tag)
    now_tag = json.loads(data_tag(now))
    if "digest" in then or "digest" in now_tag:
        if then == now_tag:
            return []
        return [f"the data changed ({then.get('rows', '?')} -> {now_tag.get('rows', '?')} rows over "
                f"{then.get('files', '?')} -> {now_tag.get('files', '?')} files; too many files to list)"]  # fmt: skip
    out = []
    for name in sorted(set(then) | set(now_tag)):
        if name not in then:
            out.append(f"{name}: new file, {now_tag[name][0]} rows")
        elif name not in now_tag:
            out.append(f"{name}: removed ({then[name][0]} rows)")
        elif then[name] != now_tag[name]:
            (a, _), (b, _) = then[name], now_tag[name]
            delta = f"{b - a:+d} rows ({a} -> {b})" if a != b else f"the same {a} rows, other content"
            out.append(f"{name}: {delta}")
    return out


def _param_changes(then: dict[str, str] | None, now: dict[str, str]) -> list[str] | None:
    if then is None:
        return None
    return [
        f"{k}: {then.get(k, '(unset)')} -> {now.get(k, '(unset)')}"
        for k in sorted(set(then) | set(now))
        if then.get(k) != now.get(k)
    ]


def _code_changes(root: Path, then: str | None, now: str, dirty: bool) -> list[str] | None:
    """The files of the code that differ between commit `then` and now (git), [] when none; None when unknown."""
    if not then or then == "unknown" or now == "unknown":
        return None
    changed: list[str] = []
    if then != now:
        diff = subprocess.run(
            ["git", "diff", "--name-only", then, now, "--", *CODE_PATHS], cwd=root, capture_output=True, text=True
        )
        if diff.returncode != 0:
            return None  # the champion's commit is not in this clone
        changed = diff.stdout.split()
    if dirty:
        status = subprocess.run(
            ["git", "diff", "--name-only", "HEAD", "--", *CODE_PATHS], cwd=root, capture_output=True, text=True
        )
        changed += [f"{f} (uncommitted)" for f in status.stdout.split() if f not in changed]
    return changed


def explain(
    root: Path,
    champion: Any | None,
    champion_params: dict[str, str] | None,
    files: dict[str, Any] | None,
    params: dict[str, str],
    commit: str,
    dirty: bool,
) -> dict[str, Any]:
    """What changed since `champion` (a model version, with its tags), as registration.json's `why`."""
    if champion is None:
        return {"compared_with": None, "summary": "the first version of this model: nothing to compare with"}
    tags = champion.tags
    data = _data_changes(tags.get(DATA_TAG), files) if files is not None else None
    changed_params = _param_changes(champion_params, params)
    code = _code_changes(root, tags.get("git_commit"), commit, dirty)
    parts = []
    for what, changes in (("data", data), ("params", changed_params), ("code", code)):
        if changes is None:
            parts.append(f"{what}: unknown")
        elif changes:
            shown = changes[:LISTED] + ([f"... and {len(changes) - LISTED} more"] if len(changes) > LISTED else [])
            parts.append(f"{what}: " + "; ".join(shown))
    known_same = data == [] and changed_params == [] and code == []
    summary = (
        f"nothing changed since champion version {champion.version} (data, params and code are the same): a "
        "scheduled or repeated run"
        if known_same
        else f"since champion version {champion.version}: " + " | ".join(parts)
    )
    return {
        "compared_with": int(champion.version),
        "data": data,
        "params": changed_params,
        "code": code,
        "summary": summary,
    }
