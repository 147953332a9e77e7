"""trainflow: an orchestrated, reproducible PyTorch training pipeline (ingest → split → train → evaluate → register)."""

from trainflow import _moved

__version__ = "0.1.0"

_moved.install()
