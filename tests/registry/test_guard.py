"""The trainflow-auth server app (trainflow.registry.guard) guards the alias the registry moves, on every route that
sets or deletes an alias; the rule at work, on a real server, is tests/registry/test_access_control.py (slow tier)."""

from __future__ import annotations

from trainflow.registry import guard, registry


def test_the_server_app_guards_the_alias_and_the_history_the_registry_writes() -> None:
    assert guard.CHAMPION == registry.CHAMPION  # named twice, so that the server needs MLflow alone
    assert guard.HISTORY_TAG == registry.HISTORY_TAG


def test_every_route_that_sets_or_deletes_an_alias_is_guarded() -> None:
    routes = guard.alias_routes()
    for prefix in ("/api/2.0/mlflow", "/ajax-api/2.0/mlflow"):
        for method in ("POST", "DELETE"):
            assert (f"{prefix}/registered-models/alias", method) in routes
    assert all(path.endswith("/registered-models/alias") for path, _ in routes)


def test_renames_and_the_models_tags_are_guarded_too() -> None:
    """What would move what `champion` means without its alias: a rename (the alias goes with the model) and the
    champion history `trainflow models rollback` follows (the rule then looks at the model's aliases, the tag's key)."""
    routes = guard.guarded_routes()
    assert guard.alias_routes() < routes
    for prefix in ("/api/2.0/mlflow", "/ajax-api/2.0/mlflow"):
        for action, method in (("rename", "POST"), ("set-tag", "POST"), ("delete-tag", "DELETE")):
            assert (f"{prefix}/registered-models/{action}", method) in routes
