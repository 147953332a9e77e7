# The MLflow tracking server of deploy/team/compose.yaml: MLflow with its access-control extra, the Postgres and S3
# clients, and trainflow itself for the `trainflow-auth` server app (an entry point; the server needs none of
# trainflow's training dependencies, hence --no-deps).
FROM python:3.11-slim
RUN pip install --no-cache-dir "mlflow[auth]==3.17.2" psycopg2-binary boto3
COPY pyproject.toml README.md /src/
COPY trainflow /src/trainflow
COPY flows /src/flows
COPY tasks /src/tasks
RUN pip install --no-cache-dir --no-deps /src
