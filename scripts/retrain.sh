#!/usr/bin/env bash
# Retrain from the last run: restore outputs from the DVC remote, reproduce only what changed, push the new outputs,
# and write what changed (params, metrics) against a base revision as markdown. What .github/workflows/retrain.yml
# runs; it runs the same way on a laptop, from any directory. Usage: bash scripts/retrain.sh
#
# Environment (all optional):
#   RETRAIN_SKIP_SETUP=1  skip `scripts/setup.sh` (use the existing .venv, or the dvc and trainflow already on PATH)
#   DVC_REMOTE_URL        storage to use as the default DVC remote, set with `--local` so .dvc/config stays as committed
#                         (s3://bucket/path, gs://..., azure://..., ssh://..., or a directory); unset: .dvc/config's
#                         default (<repo>/dvc-remote). Credentials come from the environment (AWS_*, GOOGLE_*, AZURE_*).
#   RETRAIN_BASE          revision to compare params and metrics with; unset or unknown: origin/main, else main, else HEAD
#   GITHUB_STEP_SUMMARY   file the markdown summary is appended to (GitHub Actions sets it); unset: stdout
#   RETRAIN_COMMIT=1      after the push, commit dvc.lock if it changed and `git push` it to the checked-out branch, so
#                         the next clone's `dvc pull` gets this run (needs push rights; off by default)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
step="start"
on_exit() {
  local rc=$?
  [ "$rc" -eq 0 ] || echo "retrain: FAILED while: $step (exit $rc)" >&2
}
trap on_exit EXIT
say() { echo "retrain: $*"; }
begin() { step="$*"; say "$step"; }

# GitHub Actions passes a secret that is not set as an empty string; to MLflow or a storage SDK that is not "unset".
for var in MLFLOW_TRACKING_URI AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AZURE_STORAGE_CONNECTION_STRING; do
  [ -n "${!var:-}" ] || unset "$var"
done

# 1. Tools. setup.sh installs .venv; the remote's storage type may need a DVC plugin (dvc[s3] etc.).
if [ "${RETRAIN_SKIP_SETUP:-0}" != 1 ]; then
  begin "installing (scripts/setup.sh)"
  bash scripts/setup.sh
fi
[ -d .venv/bin ] && export PATH="$root/.venv/bin:$PATH"
for tool in dvc trainflow python; do
  command -v "$tool" >/dev/null || { echo "retrain: $tool not found; run scripts/setup.sh or unset RETRAIN_SKIP_SETUP" >&2; exit 1; }
done
scheme="${DVC_REMOTE_URL:-}"
scheme="${scheme%%://*}"
case "$scheme" in
  s3 | gs | azure | ssh | hdfs | webdav | oss)
    if [ "${RETRAIN_SKIP_SETUP:-0}" != 1 ] && ! python -c "import dvc_$scheme" 2>/dev/null; then
      begin "installing dvc[$scheme] for the remote"
      python -m pip install --disable-pip-version-check -q "dvc[$scheme]"
    fi
    ;;
esac

# 2. Remote. config.local is not committed, so a secret URL never lands in git.
if [ -n "${DVC_REMOTE_URL:-}" ]; then
  begin "using DVC_REMOTE_URL as the default remote 'retrain'"
  dvc remote add --local --force --default retrain "$DVC_REMOTE_URL"
fi
remote="$(dvc remote default 2>/dev/null || true)"
if [ -z "${DVC_REMOTE_URL:-}" ] && [ "${GITHUB_ACTIONS:-}" = true ]; then
  say "warning: DVC_REMOTE_URL is not set, so outputs go to remote '$remote' from .dvc/config, on this runner only"
fi
[ -n "$remote" ] || { echo "retrain: no default DVC remote; set DVC_REMOTE_URL or add one to .dvc/config" >&2; exit 1; }

# 3. Restore the last run. --allow-missing: objects the remote lacks (an empty remote on the very first run, or a run
#    that was never pushed) are not an error, repro recomputes those outputs. Any other error (no access, no plugin,
#    a broken remote) still fails.
begin "pulling the last run's outputs from remote '$remote'"
dvc pull --allow-missing

# The base revision. Its params are in git; `dvc metrics diff` reads its metrics from the remote if they are not in the
# cache (they are not when dvc.lock changed since).
base="${RETRAIN_BASE:-}"
if [ -n "$base" ] && ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
  say "RETRAIN_BASE=$base is not a commit here; comparing with the default base instead"
  base=""
fi
if [ -z "$base" ]; then
  for candidate in origin/main main HEAD; do
    if git rev-parse -q --verify "$candidate^{commit}" >/dev/null; then base="$candidate" && break; fi
  done
fi
# A full commit hash (GitHub's event.before) makes unreadable table headers; DVC takes the short one as well.
[[ "$base" =~ ^[0-9a-f]{40}$ ]] && base="$(git rev-parse --short "$base")"

# 4. Reproduce what changed, 5. push every output (persist ones included) before anything refers to them.
begin "dvc repro"
log="$(mktemp)"
dvc repro 2>&1 | tee "$log"
ran="$(sed -n "s/^Running stage '\(.*\)':.*/\1/p" "$log" | paste -sd, - | sed 's/,/, /g')"
rm -f "$log"
begin "pushing outputs to remote '$remote'"
dvc push

# 6. Summary.
begin "writing the summary"
summary="${GITHUB_STEP_SUMMARY:-/dev/stdout}"
params="$(dvc params diff "$base" --md)"
metrics="$(dvc metrics diff "$base" --md --all)"
{
  short="$(git rev-parse --short "$base")"
  echo "## Retrain of $(git rev-parse --short HEAD) against $base$([ "$short" = "$base" ] || echo " ($short)")"
  echo
  echo "Stages run: ${ran:-none, everything was up to date}. Outputs pushed to DVC remote \`$remote\`."
  echo
  echo "### Params changed"
  echo
  if [ "$(printf '%s\n' "$params" | grep -c '^|')" -gt 2 ]; then echo "$params"; else echo "No params changed."; fi
  echo
  echo "### Metrics"
  echo
  echo "$metrics"
  echo
} >>"$summary"

# 7. Optionally record the run in git, after its outputs are in the remote.
if [ "${RETRAIN_COMMIT:-0}" = 1 ]; then
  if [ -z "$(git status --porcelain -- dvc.lock)" ]; then
    say "dvc.lock unchanged, nothing to commit"
  else
    begin "committing dvc.lock and pushing it"
    branch="$(git symbolic-ref -q --short HEAD || true)"
    branch="${branch:-${GITHUB_REF_NAME:-}}"
    [ -n "$branch" ] || { echo "retrain: detached HEAD and no GITHUB_REF_NAME: no branch to push dvc.lock to" >&2; exit 1; }
    identity=()
    git config user.name >/dev/null || identity+=(-c "user.name=${GIT_AUTHOR_NAME:-trainflow-retrain}")
    git config user.email >/dev/null || identity+=(-c "user.email=${GIT_AUTHOR_EMAIL:-retrain@trainflow.invalid}")
    git add -- dvc.lock
    git "${identity[@]}" commit -q -m "retrain: dvc.lock of the outputs pushed to DVC (stages run: ${ran:-none})" -- dvc.lock
    git push -q origin "HEAD:refs/heads/$branch"
  fi
fi
say "done"
