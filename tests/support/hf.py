"""transformers for the tests of Hugging Face models, imported behind bench/models.py's
torchvision guard (the registry's torchvision cannot load its C++ ops beside this torch,
and transformers imports it); the test is skipped without transformers."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def transformers_or_skip():
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "bench" / "models.py")
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    models.guard_torchvision_import()
    return pytest.importorskip("transformers")


def hf_model(family: tuple):
    """(model class name, config class name, config options) -> the model, eval mode, its
    weights drawn from seed 0; skipped where this transformers lacks the class."""
    import torch

    tf = transformers_or_skip()
    model_cls, config_cls, options = family
    if not hasattr(tf, model_cls):
        pytest.skip(f"this transformers has no {model_cls}")
    torch.manual_seed(0)
    return getattr(tf, model_cls)(getattr(tf, config_cls)(**options)).eval()
