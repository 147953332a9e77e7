"""Shared test support: project builders, servers, data makers and helpers that more than one test file uses."""
