"""The package version, in one place (the build reads it; the CLI and the agent report it)."""

__version__ = "0.1.0"
