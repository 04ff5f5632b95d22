"""The commands that take a model (`ditgate run | diff | inspect | checklist | matrix | flops | notebook | twin |
scaffold | export`) and the options they share (`options`: the model, its call, device and dtype, made into one
`ditgate.core.model.Model`).

May import: every ditgate package but `ditgate.commands.tools`.
"""
