"""deploy: the scheduled retraining deployment."""

from __future__ import annotations

import re

from pydantic import Field, ValidationError, field_validator

from trainflow.params.base import Section

DEFAULT_CRON = "0 3 * * *"
DEPLOYMENT_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")


class DeployParams(Section):
    """Scheduled retraining (`trainflow deploy`, prefect.yaml). No stage reads it, so changing it reruns nothing."""

    name: str = Field(
        "nightly",
        description="Deployment name; runs are started with `prefect deployment run training_pipeline/<name>`.",
    )
    cron: str = Field(
        DEFAULT_CRON,
        description="When to retrain: a five-field cron expression (minute hour day-of-month month day-of-week), "
        "e.g. '0 3 * * *' = every day at 03:00.",
    )
    timezone: str = Field(
        "UTC", description="IANA time zone the cron expression is read in (e.g. UTC, Europe/Paris, America/New_York)."
    )
    work_pool: str = Field(
        "trainflow-pool",
        min_length=1,
        description="Process work pool of the prefect.yaml deployment, for teams running a Prefect server and workers.",
    )
    push: bool = Field(
        True,
        description="After a successful flow run, push the DVC outputs (data, checkpoints, model) to DVC's default "
        "remote; skipped when no default remote is configured.",
    )
    on_new_data: bool = Field(
        True,
        description="Also retrain when new data lands: the deployment gets a trigger on the Prefect event "
        "trainflow.data.added that `trainflow data add` (and `trainflow data watch`) emit for each new file.",
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        if not DEPLOYMENT_NAME.match(v):
            raise ValueError("must be letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, v: str) -> str:
        return check_cron(v)

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, v: str) -> str:
        from zoneinfo import available_timezones  # the list Prefect checks schedules against

        if v not in available_timezones():
            raise ValueError("unknown time zone; use an IANA name such as UTC, Europe/Paris, America/New_York")
        return v


def check_cron(expr: str) -> str:
    """Validate a cron expression the way Prefect's scheduler will read it.

    Prefect's check lives behind `import prefect`, a slow import that every `trainflow stage` process would pay on
    loading params; the default expression is known good (a unit test runs it through Prefect), so only a
    changed one is checked there.
    """
    if expr == DEFAULT_CRON:
        return expr
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=expr)
    except ValidationError:
        raise ValueError(
            "not a cron expression Prefect accepts: five fields minute hour day-of-month month day-of-week, "
            "e.g. '0 3 * * *' (daily at 03:00) or '0 3 * * 1' (Mondays at 03:00); H and R are not supported"
        ) from None
    return expr
