import textwrap

import pytest
import torch

from raytune_kernels import zoo


@pytest.mark.parametrize("name, out_shape", [
    ("resnet18", (1, 1000)), ("resnet50", (1, 1000)), ("mobilenet_v2", (1, 1000)),
    ("bert_layer", (1, 128, 768)),
])
def test_zoo_models_are_seeded_and_in_eval_mode(zoo_models, name, out_shape):
    model, inputs = zoo_models[name]
    assert not model.training
    with torch.no_grad():
        out = model(*inputs)
    assert out.shape == out_shape and torch.isfinite(out).all()
    again, again_inputs = zoo.MODELS[name]()
    with torch.no_grad():
        assert torch.equal(again(*again_inputs), out)


def test_bad_model_spec():
    with pytest.raises(zoo.UnknownModelError, match="unknown model"):
        zoo.load("vgg16")


def test_a_factory_module_may_use_dataclasses_under_future_annotations(tmp_path):
    """The user's file is registered in sys.modules before it runs, as an import does:
    dataclasses look their module up there to resolve string annotations."""
    (tmp_path / "dc_model.py").write_text(textwrap.dedent("""
        from __future__ import annotations
        import dataclasses
        import torch

        @dataclasses.dataclass
        class Cfg:
            width: int = 8

        def make():
            cfg = Cfg()
            return torch.nn.Linear(4, cfg.width), (torch.randn(1, 4),)
    """))
    model, inputs = zoo.load(f"{tmp_path / 'dc_model.py'}:make")
    assert model.out_features == 8 and inputs[0].shape == (1, 4)


@pytest.mark.parametrize("body, named", [
    ("return torch.nn.Linear(4, 2)", "returned a Linear"),
    ("return (torch.randn(1, 4), torch.nn.Linear(4, 2))", r"returned a tuple of 2 \(Tensor, "
                                                          r"Linear\)"),
    ("return None", "returned a NoneType"),
])
def test_a_factory_returning_something_else_is_named(tmp_path, body, named):
    (tmp_path / "f.py").write_text(f"import torch\ndef make():\n    {body}\n")
    with pytest.raises(zoo.UnknownModelError, match=rf"f.py:make' {named}; it must return "
                                                    r"\(model, example_inputs\)"):
        zoo.load(f"{tmp_path / 'f.py'}:make")
