"""`mlflow server --app-name trainflow-auth`: MLflow's basic-auth app plus one rule, that only a user with MANAGE
permission on a registered model (or an admin) may move its `champion` alias.

Why: MLflow's permissions stop at the registered model. Creating a version and setting any alias both need EDIT on
it (mlflow.server.auth: CreateModelVersion, SetRegisteredModelAlias), so a user who may register a challenger may
also point `champion`, the version that is served, at it. Here an EDIT user registers versions, tags them and moves
`challenger` as before; setting or deleting `champion` (POST or DELETE on registered-models/alias, the /api and the
/ajax-api route, any static prefix; the alias compared without case, as a case-blind database would store it) also
needs MANAGE, which the model's creator has and an admin grants; so do renaming a model that has a champion and
writing or deleting its `champion_history` tag (its key also compared without case), which would move what
`champion` means by another way. Refused, the server answers 403 with MLflow's error body (error_code
PERMISSION_DENIED), so the client raises MlflowException(error_code="PERMISSION_DENIED"): the register
stage keeps the version as challenger and says so (trainflow.registry.registry.NotAllowed), and an allowed user moves
it with `trainflow models promote VERSION --name NAME --reason ...`. Everything else is basic-auth's, unchanged: its
`create_app` builds the app, its before-request hook authenticates and authorizes first, and the rule reuses its
functions (authenticate_request, sender_is_admin, the permission a user holds on a registered model).

Starting it (needs MLflow's `auth` extra, Flask-WTF: `pip install -e '.[team]'`; this package installed, for the
entry point `mlflow.app: trainflow-auth`):

    export MLFLOW_AUTH_CONFIG_PATH=/etc/mlflow/basic_auth.ini   # [mlflow] default_permission, database_uri,
                                                                #   admin_username, admin_password
    export MLFLOW_FLASK_SERVER_SECRET_KEY=...                   # the same on every server, as for basic-auth
    mlflow server --app-name trainflow-auth --backend-store-uri ... --serve-artifacts --host 0.0.0.0

Clients log in with MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in their environment (MLflow's own);
trainflow never writes them anywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# registry.CHAMPION and registry.HISTORY_TAG, not imported from there: the server needs MLflow alone, not the training
# stack registry.py imports (deploy/team/mlflow.Dockerfile installs trainflow without its dependencies);
# tests/registry/test_guard.py checks them.
CHAMPION = "champion"
HISTORY_TAG = "champion_history"

if TYPE_CHECKING:
    from flask import Flask

RULE = f"moving the `{CHAMPION}` alias needs MANAGE permission on the registered model (or an admin)"


def routes(*requests: type) -> frozenset[tuple[str, str]]:
    """(path, method) of every route of these request types, as MLflow's server builds its routes
    (handlers.get_endpoints: the /api and /ajax-api paths, with the static prefix when one is set)."""
    from mlflow.server.handlers import get_endpoints

    endpoints = get_endpoints(lambda request_class: request_class if request_class in requests else None)
    return frozenset((path, method) for path, found, methods in endpoints if found in requests for method in methods)


def alias_routes() -> frozenset[tuple[str, str]]:
    """Every route that sets or deletes a registered model's alias."""
    from mlflow.protos.model_registry_pb2 import DeleteRegisteredModelAlias, SetRegisteredModelAlias

    return routes(SetRegisteredModelAlias, DeleteRegisteredModelAlias)


def guarded_routes() -> frozenset[tuple[str, str]]:
    """The alias routes, and the others that would move what `champion` means: renaming the registered model (its
    aliases go with it, and the old name is free to be made anew by anyone) and writing or deleting its
    `champion_history` tag (which `trainflow models rollback` follows)."""
    from mlflow.protos.model_registry_pb2 import (
        DeleteRegisteredModelTag,
        RenameRegisteredModel,
        SetRegisteredModelTag,
    )

    return alias_routes() | routes(RenameRegisteredModel, SetRegisteredModelTag, DeleteRegisteredModelTag)


def create_app(app: Flask | None = None) -> Any:
    """MLflow's basic-auth app (mlflow.server.auth.create_app, on MLflow's server app by default) with the champion
    rule: a before-request hook registered after basic-auth's, so it runs once that one has let the request through.
    Returns what basic-auth's create_app returns (a FastAPI app wrapping the Flask one under uvicorn)."""
    from mlflow.server import app as server_app
    from mlflow.server import auth
    from mlflow.server.handlers import catch_mlflow_exception

    flask_app = server_app if app is None else app
    served = auth.create_app(flask_app)
    flask_app.before_request(catch_mlflow_exception(_champion_rule(alias_routes(), guarded_routes())))
    return served


def _champion_rule(aliases: frozenset[tuple[str, str]], guarded: frozenset[tuple[str, str]]) -> Any:
    def champion_rule() -> Any:
        """None to let the request through; a response (401) or an MlflowException (403) to refuse it."""
        from flask import Response, request
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import PERMISSION_DENIED
        from mlflow.server import auth

        where = (request.path, request.method)
        if where not in guarded:
            return None
        try:
            name = auth._get_request_param("name")
            if where in aliases:
                what = f"the `{auth._get_request_param('alias')}` alias"
                touches = str(auth._get_request_param("alias")).lower() == CHAMPION
            elif request.path.endswith("/rename"):
                what = "renaming a model that has a champion"
                touches = CHAMPION in _aliases(name)
            else:
                what = f"the `{HISTORY_TAG}` tag"
                touches = str(auth._get_request_param("key")).lower() == HISTORY_TAG  # case-blind, as the alias
        except MlflowException:
            return None  # a malformed request, or no such model: the handler answers it (400, 404)
        if not touches:
            return None
        authorization = auth.authenticate_request()  # basic-auth's hook has done it; not left to the order of hooks
        if isinstance(authorization, Response):
            return authorization
        if auth.sender_is_admin():
            return None
        held = auth._get_permission_from_registered_model_or_prompt_name()  # what basic-auth resolves for the alias
        if held.can_manage:
            return None
        raise MlflowException(
            f"trainflow-auth: {RULE} (here: {what}); user {authorization.username!r} holds {held.name} on {name!r}. "
            f"A user with MANAGE on it moves `{CHAMPION}`; versions and other aliases need EDIT only",
            error_code=PERMISSION_DENIED,
        )

    return champion_rule


def _aliases(name: str) -> dict[str, Any]:
    """The registered model's aliases, from the server's own registry store."""
    from mlflow.server.handlers import _get_model_registry_store

    return dict(_get_model_registry_store().get_registered_model(name).aliases or {})
