"""The simulator (virtual time): see README.md in this package."""
