"""deploy.cron (trainflow.params): a cron expression Prefect reads, and one it cannot refused with examples.
(The deploy section against prefect.yaml and `trainflow deploy`: tests/flows/test_deploy.py.)"""

from __future__ import annotations

import pytest

from trainflow import params as pm
from trainflow.core.errors import ParamsError


def test_check_cron() -> None:
    assert pm.check_cron(pm.DEFAULT_CRON) == "0 3 * * *"
    assert pm.check_cron("0 4 * * 1") == "0 4 * * 1"
    with pytest.raises(ValueError) as bad:
        pm.check_cron("every day")
    assert str(bad.value) == (
        "not a cron expression Prefect accepts: five fields minute hour day-of-month month day-of-week, e.g. "
        "'0 3 * * *' (daily at 03:00) or '0 3 * * 1' (Mondays at 03:00); H and R are not supported"
    )


def test_a_cron_prefect_cannot_read_is_refused_with_examples() -> None:
    from trainflow.params import validate

    with pytest.raises(ParamsError) as bad:
        validate({"deploy": {"cron": "every day"}}, "p.yaml")
    assert bad.value.problems == [
        ("deploy.cron",
         "not a cron expression Prefect accepts: five fields minute hour day-of-month month day-of-week, e.g. "
         "'0 3 * * *' (daily at 03:00) or '0 3 * * 1' (Mondays at 03:00); H and R are not supported "
         "(got 'every day')"),
    ]  # fmt: skip
