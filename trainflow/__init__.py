"""trainflow: an orchestrated, reproducible PyTorch training pipeline (ingest → split → train → evaluate → register)."""

from trainflow import _moved

__version__ = "0.2.0"

_moved.install()
