"""The queues (core): see README.md in this package."""
