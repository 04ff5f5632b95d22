"""The draft plan: what the installed cache-dit already provides for a pipeline's classes (`support`), the plan's
lines that come from observed traits (`traits`), and the Markdown plan itself (`draft`).

May import: `ditgate.core`, `ditgate.inspect` (the anatomy's dataclasses and traits).
"""
