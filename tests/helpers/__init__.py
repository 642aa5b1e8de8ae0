"""Shared builders of the test suite (networks, tasks, runs, Docker engines), one module per area."""
