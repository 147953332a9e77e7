#!/usr/bin/env bash
# Lint (ruff, and the import layers) and run the default test tier from .venv (created by scripts/setup.sh --dev):
# what README line 2 runs, in under 10 minutes on 2 cores. `bash scripts/test.sh --slow` type-checks (mypy) and runs
# the slow tier instead (real servers, Prefect deployments, fresh clones; see `slow` in pyproject.toml), which CI runs
# after README line 2.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
if [ "${1:-}" = "--slow" ]; then
  shift
  # mypy's first run in a checkout analyses torch, pandas, MLflow and Prefect: about a minute of a 2-core machine,
  # which README line 2 cannot spare (it is cached after). Before ray goes in, which would add its own analysis.
  mypy
  # The slow tier also tests tune.backend: ray, an optional extra (a ~80 MB wheel README line 2 does not need), and
  # a team's servers (the team extra: Postgres' driver, moto's S3 server, DVC's S3 remote; tests/flows/test_team.py),
  # and torchao (the fp8 extra: float8 training converts and trains on the CPU too; tests/engine/test_fp8.py).
  if ! python -c "import ray.tune, psycopg2, moto.server, dvc_s3, torchao" 2>/dev/null; then
    torch_pin="torch==$(python -W ignore -c "import torch; print(torch.__version__.split('+')[0])")"
    # uv where scripts/setup.sh installed it (seconds; pip's resolver takes minutes over trainflow's dependencies)
    python -m uv pip install --python .venv/bin/python --quiet --compile-bytecode -e ".[ray,team,fp8]" \
      -c <(echo "$torch_pin") \
      || python -m pip install --disable-pip-version-check -q -e ".[ray,team,fp8]" -c <(echo "$torch_pin")
  fi
  # Only the files that mark a test slow are collected (each worker collects what it is given: the whole suite costs
  # it seconds of imports more), unless the command is given arguments for pytest.
  if [ $# -eq 0 ]; then
    mapfile -t slow_files < <(grep -rlE "mark\.slow" tests --include='test_*.py' | sort)
    set -- "${slow_files[@]}"
  fi
  # The slow tier's longest tests (a cron's minutes, fresh clones, chains of `dvc repro`) get twice the default limit.
  # Two workers as below: most of the slow tier waits on subprocesses and servers (Slurm's queue, a cron's minute).
  # Files go to them longest first (tests/conftest.py: SLOW_LONGEST_FIRST), not xdist's most-tests-first.
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" exec python -m pytest -q -m slow -n 2 --dist loadfile --no-loadscope-reorder \
    --timeout 1200 "$@"
fi
ruff check .
ruff format --check .
lint-imports  # the layers and no import cycles (tool.importlinter in pyproject.toml)
# The docs site: a broken link between pages, or a nav entry whose page is gone, fails here (the reference pages are
# generated from the code by docs/hooks.py). Built into a temp folder: the site is not kept. Not --quiet: it hides the
# warnings from --strict, which then passes a broken link.
site=$(mktemp -d) && NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$site" && rm -rf "$site"
# Two workers, one torch thread each: most of a test's time is a subprocess starting (trainflow, DVC, a server), so
# two at once fill two cores; with torch's default threads they would fight over them (8.4 min serial, 5.0 min here).
# --dist loadfile keeps a file on one worker, so its module fixtures (a Prefect server, a chaos workspace) start once.
# `-n 0` (or any other -n) after scripts/test.sh overrides this.
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" python -m pytest -q -m "not slow" -n 2 --dist loadfile "$@"
