"""The model registry's side: versions and their lineage tags, the paired promotion gate, model cards,
what changed since the champion, and `trainflow verify`."""
