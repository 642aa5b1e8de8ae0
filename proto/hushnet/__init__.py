"""Namespace for the hushnet wire contract (see :mod:`proto`)."""
