"""Prefect flows: the training pipeline (and, later, its deployments)."""
