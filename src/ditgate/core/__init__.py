"""Core: what every stage shares. Loading a pipeline offline (a model folder, a `zoo:` name, a plugin file, remote
code only on opt-in), the request every command runs (size, frames, steps, seed, device), the pipeline's parts
(transformers and their block lists), errors and repository paths.

May import: the standard library, torch, diffusers, transformers, and `ditgate.zoo` (the loader builds `zoo:` models).
Never imports any other ditgate package.
"""
