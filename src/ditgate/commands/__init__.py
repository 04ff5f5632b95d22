"""Commands: the subcommands of the `ditgate` CLI, one module each (see `ditgate.cli`).

May import every other ditgate package; nothing but `ditgate.cli` imports it.
"""
