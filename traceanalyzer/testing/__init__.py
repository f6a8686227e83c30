"""Helpers that build small synthetic traces for tests, docs and notebooks."""
