"""Model zoo in plain torch (no torchvision): seeded random weights, eval mode.

Batch-norm statistics are calibrated on one random batch so that activations stay of unit
scale through deep networks, as they would with trained weights; then the model is frozen
in eval mode. Every factory returns (module, example_inputs).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from raytune_kernels.errors import UnknownModelError


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout)]


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, width, 3, stride)
        self.conv2, self.bn2 = _conv_bn(width, width, 3)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(cin, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, width, 1)
        self.conv2, self.bn2 = _conv_bn(width, width, 3, stride)
        self.conv3, self.bn3 = _conv_bn(width, width * 4, 1)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(cin, width * 4, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


def _downsample(cin: int, cout: int, stride: int) -> nn.Module | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(*_conv_bn(cin, cout, 1, stride))


class ResNet(nn.Module):
    def __init__(self, block: type, layers: list[int], num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = 64, []
        for i, (width, n) in enumerate(zip((64, 128, 256, 512), layers)):
            blocks = []
            for j in range(n):
                blocks.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += _conv_bn(cin, hidden, 1) + [nn.ReLU6(inplace=True)]
        layers += _conv_bn(hidden, hidden, 3, stride, groups=hidden) + [nn.ReLU6(inplace=True)]
        layers += _conv_bn(hidden, cout, 1)
        self.conv = nn.Sequential(*layers)
        self.use_res = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        feats: list[nn.Module] = [nn.Sequential(*_conv_bn(3, 32, 3, 2), nn.ReLU6(inplace=True))]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                feats.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        feats.append(nn.Sequential(*_conv_bn(cin, 1280, 1), nn.ReLU6(inplace=True)))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


class BertLayer(nn.Module):
    """One post-LayerNorm transformer encoder layer, as in BERT-base."""

    def __init__(self, hidden: int = 768, heads: int = 12, ffn: int = 3072):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.output = nn.Linear(ffn, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=1e-12)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        ctx = ctx.permute(0, 2, 1, 3).reshape(b, s, h)
        x = self.attn_norm(self.attn_out(ctx) + x)
        return self.out_norm(self.output(self.act(self.intermediate(x))) + x)


class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int, bn_size: int = 4):
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        return self.conv2(torch.relu(self.norm2(self.conv1(torch.relu(self.norm1(x))))))


class DenseNet(nn.Module):
    """DenseNet-121 (pre-activation batch norms; every layer reads the concatenation of
    all earlier feature maps of its block): the shape that made DP layout tuners blow up."""

    def __init__(self, growth: int = 32, blocks=(6, 12, 24, 16), num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        cin, self.blocks, self.transitions = 64, nn.ModuleList(), nn.ModuleList()
        for i, n in enumerate(blocks):
            self.blocks.append(nn.ModuleList(DenseLayer(cin + j * growth, growth)
                                             for j in range(n)))
            cin += n * growth
            if i < len(blocks) - 1:
                self.transitions.append(nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(),
                                                      nn.Conv2d(cin, cin // 2, 1, bias=False),
                                                      nn.AvgPool2d(2)))
                cin //= 2
        self.norm, self.fc = nn.BatchNorm2d(cin), nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i, block in enumerate(self.blocks):
            features = [x]
            for layer in block:
                features.append(layer(features))
            x = torch.cat(features, 1)
            if i < len(self.transitions):
                x = self.transitions[i](x)
        x = F.adaptive_avg_pool2d(torch.relu(self.norm(x)), 1)
        return self.fc(torch.flatten(x, 1))


def _calibrate(model: nn.Module, shape: tuple[int, ...], seed: int) -> nn.Module:
    """Set batch-norm running statistics from one random batch, then freeze in eval mode."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if bns:
        for m in bns:
            m.reset_running_stats()
            m.momentum = None  # cumulative average: one batch sets the statistics exactly
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.2, 0.2)
        model.train()
        with torch.no_grad():
            model(torch.randn((4,) + shape[1:], generator=torch.Generator().manual_seed(seed)))
    return model.eval()


def _build(factory: Callable[[], nn.Module], shape: tuple[int, ...], seed: int = 0):
    torch.manual_seed(seed)
    model = _calibrate(factory(), shape, seed + 1)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 2))
    return model, (x,)


def resnet18(batch: int = 1):
    return _build(lambda: ResNet(BasicBlock, [2, 2, 2, 2]), (batch, 3, 224, 224))


def resnet50(batch: int = 1):
    return _build(lambda: ResNet(Bottleneck, [3, 4, 6, 3]), (batch, 3, 224, 224))


def mobilenet_v2(batch: int = 1):
    return _build(MobileNetV2, (batch, 3, 224, 224))


def bert_layer(batch: int = 1, seq: int = 128):
    return _build(BertLayer, (batch, seq, 768))


def densenet121(batch: int = 1):
    return _build(DenseNet, (batch, 3, 224, 224))


MODELS: dict[str, Callable] = {
    "resnet18": resnet18, "resnet50": resnet50, "mobilenet_v2": mobilenet_v2,
    "bert_layer": bert_layer, "densenet121": densenet121,
}


def load(spec: str):
    """A zoo name, or `path/to/file.py:factory` whose factory returns (module, inputs)."""
    if spec in MODELS:
        return MODELS[spec]()
    if ":" not in spec:
        raise UnknownModelError(f"unknown model '{spec}': use one of {sorted(MODELS)} or "
                                "path/to/file.py:factory")
    return _load_factory(*spec.rsplit(":", 1))


def _load_factory(path: str, name: str):
    import importlib.util
    import pathlib

    file = pathlib.Path(path)
    if not file.is_file():
        raise UnknownModelError(f"model file '{path}' does not exist")
    import sys

    module_name = f"_rk_user_{file.stem}"
    module_spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(module_spec)
    # registered before it runs, as `import` does: dataclasses (under `from __future__
    # import annotations`), pickling and typing look the module up by name
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)  # the user's own model code, run on purpose
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UnknownModelError(f"'{path}' has no callable '{name}'")
    made = factory()
    if not (isinstance(made, (tuple, list)) and len(made) == 2
            and isinstance(made[0], torch.nn.Module)):
        raise UnknownModelError(f"'{path}:{name}' returned {_kind(made)}; it must return "
                                f"(model, example_inputs): an nn.Module and a tensor or a "
                                f"tuple of tensors")
    model, inputs = made
    return model, tuple(inputs) if not isinstance(inputs, torch.Tensor) else (inputs,)


def _kind(value) -> str:
    if isinstance(value, (tuple, list)):
        kinds = ", ".join(type(v).__name__ for v in value[:4])
        return f"a {type(value).__name__} of {len(value)} ({kinds})"
    return f"a {type(value).__name__}"
