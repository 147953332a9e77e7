"""Prefect tasks: one module per stage, each a thin shell around the stage function in trainflow.stages."""
