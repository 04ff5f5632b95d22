"""The draft plan: what the installed cache-dit already provides for a pipeline's classes (`support`), the plan's
lines that come from observed traits (`traits`), the call its Check commands carry with the sizes where CP and VAE-P
act and the cost of a default call (`call`), and the Markdown plan itself (`draft`).

May import: `ditgate.core`, `ditgate.inspect` (the anatomy's dataclasses and traits), `ditgate.inspect.flops`.
"""
