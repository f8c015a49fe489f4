"""Endpoint choice (core): see README.md in this package."""
