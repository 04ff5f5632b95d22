"""Subcommands of the `ditgate` CLI, one module each (see `ditgate.cli`)."""
