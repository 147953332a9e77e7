"""Leaves every layer uses: errors, atomic writes and hashing, the project's paths, the workspace lock,
processes, progress bars, and telling an unreachable tracking store from a refusal."""
