import pytest
import torch

from raytune_kernels import zoo


@pytest.fixture(scope="session")
def zoo_models():
    """Each zoo model built once per session: (module, example_inputs)."""
    return {name: factory() for name, factory in zoo.MODELS.items()}


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(2)
