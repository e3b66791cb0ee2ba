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
