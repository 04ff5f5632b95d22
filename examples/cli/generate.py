"""cache-dit's generate CLI with the examples of this folder registered first (nothing in cache-dit is edited).

    python examples/cli/generate.py list                      # cache-dit's examples plus zoo_flux
    python examples/cli/generate.py zoo_flux --model-path DIR --save-path base.png
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo_flux_example  # noqa: E402,F401  (registers "zoo_flux" with cache-dit's ExampleRegister)
from cache_dit.generate import entrypoint  # noqa: E402

if __name__ == "__main__":
    entrypoint()
