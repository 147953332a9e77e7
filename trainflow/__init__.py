"""trainflow: an orchestrated, reproducible PyTorch training pipeline (ingest → split → train → evaluate → register)."""

__version__ = "0.1.0"
