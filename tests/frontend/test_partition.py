import pytest
import torch
import torch.nn as nn

import raytune_kernels as rk
from raytune_kernels.frontend.partition import GlueStep, TaskStep, execute, partition


def conv_signature(task):
    """(in channels, input size, out channels, kernel, stride, epilogue) of a conv task."""
    c = task.compute
    _, cin, h, _ = c.inputs[0].shape
    k = c.inputs[1].shape
    return (cin, h, k[0], k[2], c.attr("stride")[0], tuple(e.op for e in c.epilogue))


def test_resnet18_conv_workloads(zoo_models):
    model, inputs = zoo_models["resnet18"]
    tasks = rk.extract_tasks(model, inputs)
    convs = {conv_signature(t): t.weight for t in tasks if t.compute.op == "conv2d"}
    # Architecture of ResNet-18: stem, then per stage a strided first block with a 1x1
    # downsample (which takes the residual add and relu) and an identity block.
    br, bar = ("bias", "relu"), ("bias", "add", "relu")
    expected = {(3, 224, 64, 7, 2, br): 1, (64, 56, 64, 3, 1, br): 2, (64, 56, 64, 3, 1, bar): 2}
    for cin, h, cout in ((64, 56, 128), (128, 28, 256), (256, 14, 512)):
        h2 = h // 2
        expected.update({(cin, h, cout, 3, 2, br): 1, (cout, h2, cout, 3, 1, ("bias",)): 1,
                         (cin, h, cout, 1, 2, bar): 1, (cout, h2, cout, 3, 1, br): 1,
                         (cout, h2, cout, 3, 1, bar): 1})
    assert convs == expected
    ops = sorted(t.compute.op for t in tasks if t.compute.op != "conv2d")
    assert ops == ["avg_pool2d", "dense", "max_pool2d"]
    # 20 convs, max pool, avg pool, fc: every layer maps to exactly one task
    assert sum(t.weight for t in tasks) == 23
    assert sum(len(t.layers) for t in tasks) == 23


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_layer", "resnet50"])
def test_keys_do_not_depend_on_target(zoo_models, name):
    model, inputs = zoo_models[name]
    llvm = rk.extract_tasks(model, inputs, target="llvm")
    cuda = rk.extract_tasks(model, inputs, target="cuda")
    assert [t.key for t in llvm] == [t.key for t in cuda]
    assert len({t.key for t in llvm}) == len(llvm)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_layer", "resnet50"])
def test_partition_preserves_semantics(zoo_models, name):
    model, inputs = zoo_models[name]
    part = partition(rk.capture(model, inputs))
    with torch.no_grad():
        expected = model(*inputs)
    got = execute(part, inputs)[0]
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4
    layers = [s for s in part.steps if isinstance(s, TaskStep)]
    assert len(layers) == sum(t.weight for t in part.tasks)


def test_bert_layer_tasks(zoo_models):
    model, inputs = zoo_models["bert_layer"]
    tasks = {t.compute.describe(): t for t in rk.extract_tasks(model, inputs)}
    qkv = tasks["dense 1x128x768 -> 1x128x768 +bias"]
    assert qkv.weight == 3 and qkv.layers == ("query", "key", "value")
    assert tasks["layer_norm 1x128x768"].weight == 2
    assert "dense 1x128x768 -> 1x128x3072 +bias+gelu" in tasks
    assert "matmul 1x12x128x64 -> 1x12x128x128 +div" in tasks


class SqueezeExcite(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        s = torch.sigmoid(self.fc(nn.functional.adaptive_avg_pool2d(y, 1)))
        return y * s  # broadcasts s up: must not be fused into the small fc task


def test_broadcast_mul_is_not_fused_into_the_smaller_task():
    model = SqueezeExcite().eval()
    x = torch.randn(1, 8, 6, 6)
    part = partition(rk.capture(model, (x,)))
    described = [t.compute.describe() for t in part.tasks]
    assert "conv2d 1x8x1x1 -> 8ch k1x1 s1 +bias+sigmoid" in described
    assert "elementwise 1x8x6x6 +mul" in described
    assert (execute(part, (x,))[0] - model(x)).abs().max() < 1e-5


def test_reversed_and_scalar_operands():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, y):
            return 2.0 / (y - self.fc(x))

    model, inputs = M(), (torch.randn(3, 4), torch.randn(3, 4))
    part = partition(rk.capture(model, inputs))
    (task,) = part.tasks
    assert [(e.op, e.reverse, e.scalar) for e in task.compute.epilogue] == \
        [("bias", False, None), ("sub", True, None), ("div", True, 2.0)]
    assert torch.allclose(execute(part, inputs)[0], model(*inputs), rtol=1e-5, atol=1e-5)


def test_glue_steps_run_between_tasks(zoo_models):
    model, inputs = zoo_models["bert_layer"]
    part = partition(rk.capture(model, inputs))
    glue = [s for s in part.steps if isinstance(s, GlueStep)]
    nodes = part.graph.node_map()
    assert {nodes[s.node].op for s in glue} == {"reshape", "permute"}
