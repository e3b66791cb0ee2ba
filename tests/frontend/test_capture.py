import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import raytune_kernels as rk
from raytune_kernels.frontend.partition import execute, partition


def ops_of(graph):
    return [n.op for n in graph.nodes]


def check_same(model, *inputs, atol=1e-5):
    """Capture, partition and execute through references; compare with the model."""
    graph = rk.capture(model, inputs)
    with torch.no_grad():
        expected = model(*inputs)
    got = execute(partition(graph), inputs)
    expected = expected if isinstance(expected, (tuple, list)) else [expected]
    for e, g in zip(expected, got):
        assert (e - g).abs().max().item() <= atol
    return graph


class ConvZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.strided = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.dilated = nn.Conv2d(8, 8, 3, padding=2, dilation=2, bias=False)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.depthwise = nn.Conv2d(8, 8, 3, padding="same", groups=8)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.bn(self.dilated(self.strided(x)))
        return F.silu(self.depthwise(torch.sigmoid(self.grouped(y))))


def test_conv_variants_capture_and_fold_batch_norm():
    model = ConvZoo().eval()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    graph = check_same(model, torch.randn(1, 4, 16, 16))
    assert ops_of(graph) == ["conv2d", "conv2d", "conv2d", "sigmoid", "conv2d", "silu"]
    convs = [n for n in graph.nodes if n.op == "conv2d"]
    assert [c.attr("groups") for c in convs] == [1, 1, 2, 8]
    assert convs[0].attr("stride") == (2, 2) and convs[1].attr("dilation") == (2, 2)
    assert convs[3].attr("padding") == (1, 1)
    assert len(convs[1].inputs) == 3  # the folded batch norm gave the bias-free conv a bias


def test_batch_norm_not_folded_when_conv_output_is_shared():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y

    graph = check_same(Shared().eval(), torch.randn(1, 3, 5, 5))
    assert ops_of(graph) == ["conv2d", "affine", "add"]


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.ln = nn.LayerNorm(64)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x, a, b):
        h = torch.max_pool2d(x, 2) + self.pool(x)
        h = F.adaptive_avg_pool2d(h, 1).view(h.size(0), -1)
        h = torch.relu(self.bn(self.fc(h))) * 0.5
        z = torch.cat([h, 1.0 - h], dim=1)
        s = torch.bmm(a, b.transpose(1, 2))
        return F.gelu(self.ln(z.reshape(2, 64, 1).flatten(1))), \
            F.softmax(s / 4.0, dim=-1), F.relu6(s)


def test_mixed_ops_capture_and_run():
    model = Mixed().eval()
    inputs = (torch.randn(2, 16, 4, 4), torch.randn(3, 5, 7), torch.randn(3, 6, 7))
    graph = check_same(model, *inputs)
    ops = ops_of(graph)
    for op in ("max_pool2d", "avg_pool2d", "reshape", "dense", "concat", "permute",
               "matmul", "softmax", "layer_norm", "gelu", "relu6", "div", "sub"):
        assert op in ops, op
    assert "affine" not in ops  # BatchNorm1d folded into the dense before it
    sub = next(n for n in graph.nodes if n.op == "sub")
    assert sub.attr("scalar") == 1.0 and sub.attr("reverse") is True


def test_layer_names_are_module_paths():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Sequential(nn.ReLU(), nn.Conv2d(8, 8, 1)))
    graph = rk.capture(model, (torch.randn(1, 3, 8, 8),))
    assert [n.layer for n in graph.nodes] == ["0", "1.0", "1.1"]


class Cumprod(nn.Module):
    def forward(self, x):
        return torch.cumprod(x, 1)


def test_strict_capture_names_the_unsupported_op_and_layer():
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.Sequential(nn.ReLU(), Cumprod()))
    with pytest.raises(rk.UnsupportedOpError) as info:
        rk.capture(model, (torch.randn(1, 3, 4, 4),), strict=True)
    assert info.value.op == "cumprod" and info.value.layer.startswith("1.1")
    assert "cumprod" in str(info.value) and "'1.1" in str(info.value)


def test_strict_capture_names_an_unknown_module_type():
    model = nn.Sequential(nn.Linear(4, 4), nn.Softshrink())
    with pytest.raises(rk.UnsupportedOpError, match="'Softshrink' in layer '1'"):
        rk.capture(model, (torch.randn(2, 4),), strict=True)
    with pytest.raises(rk.UnsupportedOpError, match="'Softshrink' in layer '1'"):
        rk.extract_tasks(model, (torch.randn(2, 4),), strict=True)


class NonZero(nn.Module):
    def forward(self, x):
        return torch.nonzero(x)


class ValueBranch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_value_dependent_shapes_are_refused():
    with pytest.raises(rk.DynamicShapeError, match="nonzero"):
        rk.capture(nn.Sequential(nn.ReLU(), NonZero()), (torch.randn(4, 4),))
    with pytest.raises(rk.DynamicShapeError, match="depends on tensor values"):
        rk.capture(ValueBranch(), (torch.randn(4),))


class ShapeBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        if y.shape[-1] > 4:  # fx cannot trace this; torch.export specialises it
            y = F.max_pool2d(y, 2)
        return torch.relu(y)


def test_a_forward_that_raises_without_a_message_is_named():
    class Checks(nn.Module):
        def forward(self, x):
            if x.shape[0] != 5:  # a bare `assert` (pytest would give it a message here)
                raise AssertionError
            return x * 2

    with pytest.raises(rk.CaptureError, match="could capture Checks: AssertionError "
                                              r"\(with no message\) raised by the model"):
        rk.extract_tasks(Checks(), (torch.randn(2, 3),))


def test_shape_control_flow_goes_through_export():
    graph = check_same(ShapeBranch().eval(), torch.randn(1, 3, 8, 8))
    assert ops_of(graph) == ["conv2d", "max_pool2d", "relu"]
    assert graph.nodes[0].layer == "conv"


def test_other_float_dtypes_are_refused():
    with pytest.raises(rk.CaptureError, match="dtype torch.float64"):
        rk.capture(nn.ReLU(), (torch.ones(3, dtype=torch.float64),))


def test_integer_inputs_feed_embeddings():
    """Token ids (int64) are model inputs like any other; the embedding reads them back as
    integers (values live in float32 buffers, exact below 2**24)."""
    model = nn.Sequential(nn.Embedding(1000, 16), nn.Linear(16, 8)).eval()
    ids = torch.randint(0, 1000, (1, 12))
    graph = rk.capture(model, (ids,), strict=False)
    other = torch.randint(0, 1000, (1, 12))
    with torch.no_grad():
        assert torch.equal(execute(partition(graph), [other])[0], model(other))
    assert [n.op for n in graph.nodes] == ["embedding", "dense"]


def test_torchvision_stochastic_depth_is_found_by_its_qualified_name():
    """torchvision's stochastic_depth (an fx-wrapped function) is the identity in eval;
    it is matched by module and name, so the core never imports torchvision."""
    from raytune_kernels.frontend import ops

    def stochastic_depth(input, p, mode, training=True):
        return input
    stochastic_depth.__module__ = "torchvision.ops.stochastic_depth"
    stochastic_depth.__qualname__ = "stochastic_depth"
    assert ops.lookup(stochastic_depth)[1] is ops.stochastic_depth_handler
    assert ops.lookup(torch.relu) is not None and ops.lookup(lambda x: x) is None


class OptionalMask(nn.Module):
    def forward(self, x, attn_mask=None):
        return torch.relu(x) if attn_mask is None else torch.relu(x + attn_mask)


def test_an_optional_input_left_out_takes_its_default():
    graph = rk.capture(OptionalMask(), (torch.randn(2, 4),))
    assert [n.op for n in graph.nodes] == ["relu"] and len(graph.inputs) == 1


class Unused(nn.Module):
    def forward(self, x):
        torch.sort(x, dim=1)  # computed, never read
        torch.sigmoid(x)
        return torch.relu(x)


def test_nodes_nothing_reads_are_dropped():
    graph = rk.capture(Unused(), (torch.randn(2, 4),))
    assert [n.op for n in graph.nodes] == ["relu"]


class Conv1D(nn.Module):
    """GPT-2's projection: addmm(bias, x, w)."""

    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(16, 24)), nn.Parameter(torch.randn(24))

    def forward(self, x):
        return torch.addmm(self.b, x.view(-1, 16), self.w).view(2, 5, 24)


def test_addmm_of_a_weight_is_a_dense_with_a_bias_epilogue():
    """GPT-2's Conv1D: its weight [in, out] packed as a dense's, transposed once."""
    model, x = Conv1D(), torch.randn(2, 5, 16)
    graph = rk.capture(model, (x,), strict=True)
    assert [n.op for n in graph.nodes] == ["reshape", "dense", "add", "reshape"]
    (task,) = partition(graph).tasks
    assert task.compute.op == "dense" and [e.op for e in task.compute.epilogue] == ["add"]
    with torch.no_grad():
        assert torch.allclose(execute(partition(graph), [x])[0], model(x), atol=1e-5)


class Addmm(nn.Module):
    """addmm of two activations: a matmul."""

    def forward(self, x, y, bias):
        return torch.addmm(bias, x, y)


def test_addmm_of_activations_stays_a_matmul():
    x, y, bias = torch.randn(5, 16), torch.randn(16, 24), torch.randn(24)
    graph = rk.capture(Addmm(), (x, y, bias), strict=True)
    assert [n.op for n in graph.nodes] == ["matmul", "add"]
    with torch.no_grad():
        assert torch.allclose(execute(partition(graph), [x, y, bias])[0],
                              Addmm()(x, y, bias), atol=1e-5)


class SqueezeExcite(nn.Module):
    """RegNetY's squeeze-excite: 1x1 convs of a pooled 1x1 map with 26 and 104 channels."""

    def __init__(self):
        super().__init__()
        self.squeeze, self.expand = nn.Conv2d(104, 26, 1), nn.Conv2d(26, 104, 1)

    def forward(self, x):
        s = torch.relu(self.squeeze(F.adaptive_avg_pool2d(x, 1)))
        return x * torch.sigmoid(self.expand(s))


def test_a_squeeze_conv_whose_channels_do_not_fill_vectors_is_padded():
    """26 output channels do not fill 8-float vectors: the squeeze conv gets 6 zero
    channels (frontend/passes.pad_channels), which the expand conv reads as zero weights."""
    model, x = SqueezeExcite().eval(), torch.randn(1, 104, 7, 7)
    graph = check_same(model, x)
    assert ops_of(graph).count("conv2d") == 2 and "index" not in ops_of(graph)
    tasks = partition(graph).tasks
    assert 32 in {t.compute.output.shape[1] for t in tasks if t.compute.op == "conv2d"}
    from raytune_kernels.cpu.schedules import no_kernel_reason
    from raytune_kernels.cpu.machine import cpu_info
    assert [no_kernel_reason(t.compute, cpu_info()) for t in tasks] == [None] * len(tasks)


class _Cached(nn.Module):
    """A Hugging Face-like decoder: with config.use_cache its forward also returns a cache
    object, which no graph carries out."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"use_cache": True})()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return (y, object()) if self.config.use_cache else (y,)


def test_capture_turns_a_models_kv_cache_off_so_only_tensors_come_out():
    model, x = _Cached(), torch.randn(2, 4)
    graph = rk.capture(model, (x,), strict=True)
    assert model.config.use_cache is False and len(graph.outputs) == 1
    assert torch.allclose(execute(partition(graph), [x])[0], model(x)[0], atol=1e-6)
