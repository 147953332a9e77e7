"""The trainflow-auth server app (trainflow.registry.guard) guards the alias the registry moves, on every route that
sets or deletes an alias; the rule at work, on a real server, is tests/registry/test_access_control.py (slow tier)."""

from __future__ import annotations

from trainflow.registry import guard, registry


def test_the_server_app_guards_the_alias_the_registry_moves() -> None:
    assert guard.CHAMPION == registry.CHAMPION  # named twice, so that the server needs MLflow alone


def test_every_route_that_sets_or_deletes_an_alias_is_guarded() -> None:
    routes = guard.alias_routes()
    for prefix in ("/api/2.0/mlflow", "/ajax-api/2.0/mlflow"):
        for method in ("POST", "DELETE"):
            assert (f"{prefix}/registered-models/alias", method) in routes
    assert all(path.endswith("/registered-models/alias") for path, _ in routes)
