"""Whether an exception from MLflow's store means it could not answer now (retry later) or that what was asked does
not exist: the two answers every caller of the tracking store and registry must tell apart from a refusal or a bug.
MLflow is imported inside each function: importing this module costs nothing."""

from __future__ import annotations

# MLflow error codes that say the store could not serve a request just now, whatever it holds: SqlAlchemyStore turns
# a locked or unreadable SQLite file (OperationalError) into TEMPORARILY_UNAVAILABLE, and a tracking server answers
# 503, 504 and 429 with these codes in its JSON body.
UNAVAILABLE_CODES = frozenset(
    {"TEMPORARILY_UNAVAILABLE", "DEADLINE_EXCEEDED", "REQUEST_LIMIT_EXCEEDED", "RESOURCE_EXHAUSTED"}
)


def unavailable(exc: BaseException) -> bool:
    """Whether `exc` means the tracking store could not be reached or could not answer now (as opposed to a refusal
    or a bug): MLflow's REST client reports exhausted retries (a 503 on every try, a connection refused) and timeouts
    as an MlflowException wrapping the connection error; the stores report the rest with UNAVAILABLE_CODES."""
    import requests
    from mlflow.exceptions import MlflowException

    if isinstance(exc, requests.exceptions.RequestException | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, MlflowException):
        if exc.error_code in UNAVAILABLE_CODES:
            return True
        text = str(exc)
        return "Max retries exceeded" in text or "failed with exception" in text or "timed out" in text.lower()
    return False


def not_found(exc: BaseException) -> bool:
    """Whether `exc` is the registry answering that what was looked up does not exist. MLflow 3.17 says so with
    RESOURCE_DOES_NOT_EXIST for a model or a version, and with INVALID_PARAMETER_VALUE ("Registered model alias
    champion not found.") for an alias, from a SQLite store and a tracking server alike (pinned by
    tests/stages/test_registry.py and tests/reliability/test_tracking_outage.py). Nothing else is: a timeout, a 503,
    a locked store, or a 404 from something that is not an MLflow server (ENDPOINT_NOT_FOUND) says nothing about
    what the registry holds."""
    from mlflow.exceptions import MlflowException

    if not isinstance(exc, MlflowException):
        return False
    if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
        return True
    return exc.error_code == "INVALID_PARAMETER_VALUE" and "not found" in exc.message
