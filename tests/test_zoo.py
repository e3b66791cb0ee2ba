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
