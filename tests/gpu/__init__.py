"""The GPU tier: what the CPU tests simulate, run on a real NVIDIA GPU. Skipped where CUDA is not available.

A package (this file) so that its conftest.py imports as `gpu.conftest`: a second top-level `conftest` module would
take the place of tests/conftest.py in sys.modules. The helpers both tiers use are in tests/support.
"""
