-- One database each for the MLflow tracking server, the Prefect server and Optuna (tune.storage).
CREATE DATABASE mlflow;
CREATE DATABASE prefect;
CREATE DATABASE optuna;
