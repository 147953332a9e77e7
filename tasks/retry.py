"""Retry policy for the tasks that touch the outside world: the data source, the tracking server and registry, the
DVC remote. A transient failure there (a network blip, a busy server) is retried with exponential backoff; a
UserError (bad params or data, exit code 2 in the CLI) fails at once, since rerunning cannot fix it.

The first delay is TRAINFLOW_RETRY_DELAY_S seconds (default 10, so 10, 20, 40 s), read when this module is imported:
Prefect resolves a task's delays when the task is defined. Tests set it to 0.
"""

from __future__ import annotations

import os
from typing import Any

from prefect.tasks import exponential_backoff

from trainflow.core.errors import UserError

RETRIES = 3
FIRST_DELAY_S = float(os.environ.get("TRAINFLOW_RETRY_DELAY_S", "10"))


def _exception(state: Any) -> BaseException | None:
    """The exception a Failed state holds (Prefect wraps a raised exception as the state's data)."""
    if isinstance(state.data, BaseException):
        return state.data
    result = state.result(raise_on_failure=False)
    return result if isinstance(result, BaseException) else None


def retry_unless_user_error(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry_condition_fn: retry anything but a UserError.

    Must stay a plain function: Prefect 3.8 calls it only if `inspect.isfunction` is true and otherwise treats a
    callable object or a functools.partial as "do not retry".
    """
    return not isinstance(_exception(state), UserError)


# Keyword arguments for @task on a task that talks to something outside this process.
OUTSIDE_WORLD: dict[str, Any] = {
    "retries": RETRIES,
    "retry_delay_seconds": exponential_backoff(backoff_factor=FIRST_DELAY_S),
    "retry_condition_fn": retry_unless_user_error,
}
