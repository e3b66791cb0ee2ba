"""Convs whose output channels do not fill 8-float vectors (ShuffleNet's 58 and 116) get
zero channels up to the next multiple, carried through what treats channels one by one,
so every task has a kernel of ours and the results do not change."""
import pytest
import torch
import torch.nn as nn

import raytune_kernels as rk
from raytune_kernels.compile.api import compile_network
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.schedules import no_kernel_reason
from raytune_kernels.frontend.partition import execute, partition


def _unit(c):
    return nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                         nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.BatchNorm2d(c),
                         nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())


class Shuffle(nn.Module):
    """ShuffleNetV2's units at 58 and 116 channels: chunk, a branch, cat, channel shuffle,
    and a strided unit whose depthwise conv reads the shuffled (unpadded) 116 channels."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 116, 3, padding=1)
        self.unit = _unit(58)
        self.down = nn.Sequential(nn.Conv2d(116, 116, 3, 2, 1, groups=116), nn.BatchNorm2d(116),
                                  nn.Conv2d(116, 116, 1), nn.ReLU())

    def forward(self, x):
        x = self.stem(x)
        a, b = x.chunk(2, dim=1)
        x = torch.cat((a, self.unit(b)), dim=1)
        x = x.view(1, 2, 58, 8, 8).transpose(1, 2).reshape(1, 116, 8, 8)
        return self.down(x)


def _randomize(model):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-1, 1)
    return model.eval()


def test_ragged_channels_are_padded_and_every_task_has_a_kernel():
    torch.manual_seed(0)
    model, x = _randomize(Shuffle()), torch.randn(1, 3, 8, 8)
    graph = rk.capture(model, (x,), strict=True)
    tasks = partition(graph).tasks
    assert [no_kernel_reason(t.compute, cpu_info()) for t in tasks] == [None] * len(tasks)
    convs = [t.compute for t in tasks if t.compute.op == "conv2d"]
    assert {c.output.shape[1] for c in convs} <= {64, 120}  # 58 and 116, padded
    y = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        want = model(y)
    assert torch.allclose(execute(partition(graph), [y])[0], want, atol=1e-5, rtol=1e-5)
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, (x,))
    assert all(s.kind != "torch" for s in net.steps)
    with torch.no_grad():
        assert torch.allclose(net(y), want, atol=1e-4, rtol=1e-4)


class Reciprocal(nn.Module):
    """1/x of a padded conv output: the padding would become inf, so it is sliced off
    first (inf times a zero weight would be NaN)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(4, 12, 1), nn.Conv2d(12, 8, 1)

    def forward(self, x):
        return self.b(1.0 / self.a(x).square())  # 1 / 0 on the padding


def test_padding_is_sliced_off_where_its_value_would_not_stay_finite():
    torch.manual_seed(0)
    model, x = Reciprocal().eval(), torch.randn(1, 4, 5, 5)
    graph = rk.capture(model, (x,), strict=True)
    ops = [n.op for n in graph.nodes]
    assert "index" in ops  # the slice back to 12 channels before the division
    got = execute(partition(graph), [x])[0]
    assert torch.isfinite(got).all()
    with torch.no_grad():
        assert torch.allclose(got, model(x), rtol=1e-4)
