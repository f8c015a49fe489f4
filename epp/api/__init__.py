"""The interface's types (core): see README.md in this package."""
