"""`mlflow server --app-name trainflow-auth`: MLflow's basic-auth app plus one rule, that only a user with MANAGE
permission on a registered model (or an admin) may move its `champion` alias.

Why: MLflow's permissions stop at the registered model. Creating a version and setting any alias both need EDIT on
it (mlflow.server.auth: CreateModelVersion, SetRegisteredModelAlias), so a user who may register a challenger may
also point `champion`, the version that is served, at it. Here an EDIT user registers versions, tags them and moves
`challenger` as before; setting or deleting `champion` (POST or DELETE on registered-models/alias, the /api and the
/ajax-api route, any static prefix; the alias compared without case, as a case-blind database would store it) also
needs MANAGE, which the model's creator has and an admin grants. Refused, the server answers 403 with MLflow's error
body (error_code PERMISSION_DENIED), so the client raises MlflowException(error_code="PERMISSION_DENIED"): the register
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

# registry.CHAMPION, not imported from there: the server needs MLflow alone, not the training stack registry.py
# imports (deploy/team/mlflow.Dockerfile installs trainflow without its dependencies); tests/registry checks the two.
CHAMPION = "champion"

if TYPE_CHECKING:
    from flask import Flask

RULE = f"moving the `{CHAMPION}` alias needs MANAGE permission on the registered model (or an admin)"


def alias_routes() -> frozenset[tuple[str, str]]:
    """(path, method) of every route that sets or deletes a registered model's alias, as MLflow's server builds its
    routes (handlers.get_endpoints: the /api and /ajax-api paths, with the static prefix when one is set)."""
    from mlflow.protos.model_registry_pb2 import DeleteRegisteredModelAlias, SetRegisteredModelAlias
    from mlflow.server.handlers import get_endpoints

    wanted = (SetRegisteredModelAlias, DeleteRegisteredModelAlias)
    endpoints = get_endpoints(lambda request_class: request_class if request_class in wanted else None)
    return frozenset((path, method) for path, found, methods in endpoints if found in wanted for method in methods)


def create_app(app: Flask | None = None) -> Any:
    """MLflow's basic-auth app (mlflow.server.auth.create_app, on MLflow's server app by default) with the champion
    rule: a before-request hook registered after basic-auth's, so it runs once that one has let the request through.
    Returns what basic-auth's create_app returns (a FastAPI app wrapping the Flask one under uvicorn)."""
    from mlflow.server import app as server_app
    from mlflow.server import auth
    from mlflow.server.handlers import catch_mlflow_exception

    flask_app = server_app if app is None else app
    served = auth.create_app(flask_app)
    flask_app.before_request(catch_mlflow_exception(_champion_rule(alias_routes())))
    return served


def _champion_rule(routes: frozenset[tuple[str, str]]) -> Any:
    def champion_rule() -> Any:
        """None to let the request through; a response (401) or an MlflowException (403) to refuse it."""
        from flask import Response, request
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import PERMISSION_DENIED
        from mlflow.server import auth

        if (request.path, request.method) not in routes:
            return None
        try:
            alias = auth._get_request_param("alias")
            name = auth._get_request_param("name")
        except MlflowException:
            return None  # a malformed request: the handler answers it (400)
        if str(alias).lower() != CHAMPION:
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
            f"trainflow-auth: {RULE}; user {authorization.username!r} holds {held.name} on {name!r}. A user with "
            f"MANAGE on it moves `{CHAMPION}`; versions and other aliases need EDIT only",
            error_code=PERMISSION_DENIED,
        )

    return champion_rule
