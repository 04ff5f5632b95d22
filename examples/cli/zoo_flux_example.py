"""A cache-dit generate-CLI example for a local FluxPipeline folder (`ditgate zoo build zoo:flux DIR` makes one).

This is the function a contribution adds to cache-dit's `src/cache_dit/_utils/examples.py`; there it imports
`Example`, `ExampleRegister` and friends relatively (`from .registers import ...`) and its variable goes into
`_env_path_mapping`. Here it is registered from outside cache-dit, so it can be tried with `generate.py` in this
folder before the patch exists. The model path comes from `--model-path`, else `ZOO_FLUX_DIR`.
"""

import argparse

from cache_dit._utils.examples import _path
from cache_dit._utils.registers import Example, ExampleInitConfig, ExampleInputData, ExampleRegister, ExampleType


@ExampleRegister.register("zoo_flux", default="zoo/flux")
def zoo_flux_example(args: argparse.Namespace, **kwargs) -> Example:
    from diffusers import FluxPipeline

    return Example(
        args=args,
        init_config=ExampleInitConfig(
            task_type=ExampleType.T2I,
            model_name_or_path=_path("zoo/flux", args=args, ENV="ZOO_FLUX_DIR"),
            pipeline_class=FluxPipeline,
        ),
        input_data=ExampleInputData(
            prompt="a tiny red cube on a table",
            height=128, width=128, num_inference_steps=8, guidance_scale=3.5,
        ),
    )
