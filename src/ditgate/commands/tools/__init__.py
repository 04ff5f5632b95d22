"""The commands that take no model: `ditgate gate | lint | skill | zoo | serve`.

May import: every ditgate package but `ditgate.commands.model`.
"""
