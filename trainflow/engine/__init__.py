"""The training engine: precision policy, schedules, checkpoints and the trainer loop. No Prefect, DVC or MLflow."""
