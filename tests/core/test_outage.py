"""trainflow.core.outage: an unreachable tracking store (no answer) told from an answer that something is not there."""

from __future__ import annotations

from trainflow.core import outage


def test_unavailable_and_not_found_tell_an_outage_from_an_answer() -> None:
    import requests
    from mlflow.exceptions import MlflowException

    def mlflow_error(message: str, code: str) -> MlflowException:
        exc = MlflowException(message)
        exc.error_code = code
        return exc

    outages = [
        requests.exceptions.ConnectionError("refused"),
        ConnectionError("reset"),
        TimeoutError("slow"),
        mlflow_error("x", "TEMPORARILY_UNAVAILABLE"),
        mlflow_error("x", "DEADLINE_EXCEEDED"),
        mlflow_error("x", "REQUEST_LIMIT_EXCEEDED"),
        mlflow_error("x", "RESOURCE_EXHAUSTED"),
        mlflow_error("HTTPConnectionPool: Max retries exceeded with url", "INTERNAL_ERROR"),
        mlflow_error("API request to /x failed with exception boom", "INTERNAL_ERROR"),
        mlflow_error("Read Timed Out", "INTERNAL_ERROR"),
    ]
    answers = [
        mlflow_error("Registered model alias champion not found.", "INVALID_PARAMETER_VALUE"),
        mlflow_error("gone", "RESOURCE_DOES_NOT_EXIST"),
        mlflow_error("bad", "INVALID_PARAMETER_VALUE"),
        mlflow_error("max retries exceeded", "INTERNAL_ERROR"),  # MLflow's text is capitalised
        ValueError("Max retries exceeded"),
    ]
    assert [outage.unavailable(e) for e in outages] == [True] * len(outages)
    assert [outage.unavailable(e) for e in answers] == [False] * len(answers)
    assert [outage.not_found(e) for e in answers] == [True, True, False, False, False]
    assert [outage.not_found(e) for e in outages] == [False] * len(outages)
    assert not outage.not_found(mlflow_error("not found", "ENDPOINT_NOT_FOUND"))
