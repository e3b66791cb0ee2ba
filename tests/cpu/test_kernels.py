"""Property tests: sampled configs of every lowerable zoo task compile and match torch."""
import math
import random

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.kernel import run_candidate
from raytune_kernels.cpu.loopnest import interpret
from raytune_kernels.cpu.lower import LoweringError, operand_kinds
from raytune_kernels.cpu.schedules import lower, pack, space_for, unpack, unsupported_reason
from raytune_kernels.space import Config
from raytune_kernels.measure import random_operands
from raytune_kernels.frontend.reference import reference


def operands(compute, seed=0):
    """Random operands scaled like trained weights (the measurer's own generator)."""
    return random_operands(compute, seed)


def lowerable(name, zoo_models):
    model, inputs = zoo_models[name]
    tasks = rk.extract_tasks(model, inputs)
    assert [unsupported_reason(t.compute) for t in tasks] == [None] * len(tasks)
    return tasks


def check_configs(task, n, seed):
    space = space_for(task.compute, cpu_info())
    ops = operands(task.compute, seed)
    expected = reference(task.compute, *ops)
    rng = random.Random(seed)
    for _ in range(n):
        cfg = space.sample(rng)
        got = run_candidate(task.compute, cfg, ops, threads=2)
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), \
            (task.compute.describe(), cfg, (got - expected).abs().max().item())


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_layer"])
def test_sampled_configs_match_reference(zoo_models, name):
    for i, task in enumerate(lowerable(name, zoo_models)):
        check_configs(task, 2, seed=i)


class SqueezeExcite(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.Conv2d(16, 16, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        s = torch.sigmoid(self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1)))
        return torch.sigmoid(y * s - 0.5)


def test_elementwise_task_with_a_channel_operand_compiles_and_interprets():
    tasks = rk.extract_tasks(SqueezeExcite().eval(), (torch.randn(1, 16, 8, 8),))
    (task,) = [t for t in tasks if t.compute.op == "elementwise"]
    ops = [torch.randn(s.shape) for s in task.compute.inputs]
    ops += [torch.randn(s.shape) for e in task.compute.epilogue for s in e.operands]
    expected = reference(task.compute, *ops)
    for cfg in space_for(task.compute, cpu_info()):
        assert torch.allclose(run_candidate(task.compute, cfg, ops, 2), expected, atol=1e-5)
        bufs = pack(task.compute, cfg, ops)
        interpret(lower(task.compute, cfg), bufs)
        assert torch.allclose(unpack(task.compute, cfg, bufs["out"]), expected, atol=1e-5)


@pytest.mark.parametrize("out, operand", [
    ((1, 4, 16, 8), (1, 1, 16, 8)),  # rotary cos/sin: one table for every head
    ((1, 16, 4, 8), (1, 16, 4, 1)),  # Qwen3's per-head RMSNorm: one scale per last-axis row
])
def test_elementwise_operands_of_decoder_layers_lower_in_every_config(out, operand):
    """The operands of a decoder layer's elementwise tasks: the same row for every
    channel, and one value per row of the last axis (the task then reads last-axis rows),
    run by the interpreter and by the built kernel in every config of its space."""
    from raytune_kernels.task import Compute, EpilogueOp, TensorSpec
    compute = Compute("elementwise", (TensorSpec(out),), TensorSpec(out), (),
                      (EpilogueOp("mul", (TensorSpec(operand),)), EpilogueOp("neg")))
    ops = [torch.randn(out), torch.randn(operand)]
    expected = reference(compute, *ops)
    for cfg in space_for(compute, cpu_info()):
        bufs = pack(compute, cfg, ops)
        interpret(lower(compute, cfg), bufs)
        assert torch.allclose(unpack(compute, cfg, bufs["out"]), expected, atol=1e-6), cfg
        assert torch.allclose(run_candidate(compute, cfg, ops, 2), expected, atol=1e-6), cfg


def test_a_per_channel_operand_on_rows_of_a_1d_signal_lowers_in_every_config():
    """A group norm's weights on (1, C, L) (a speech feature extractor's): an affine along
    axis 1 of last-axis rows, one value per row."""
    from raytune_kernels.task import Compute, EpilogueOp, TensorSpec
    out = TensorSpec((1, 6, 20))
    compute = Compute("elementwise", (out,), out, (),
                      (EpilogueOp("affine", (TensorSpec((6,)),) * 2, axis=1),
                       EpilogueOp("gelu")))
    ops = [torch.randn(1, 6, 20), torch.randn(6), torch.randn(6)]
    expected = reference(compute, *ops)
    for cfg in space_for(compute, cpu_info()):
        assert torch.allclose(run_candidate(compute, cfg, ops, 2), expected, atol=1e-5), cfg


def test_conv1d_tasks_match_reference_in_sampled_configs():
    """1-D convs are conv2d tasks of height 1 (a 1 x k kernel, strided and dilated along
    the width, depthwise too): sampled configs of their spaces compile and match."""
    model = torch.nn.Sequential(torch.nn.Conv1d(8, 16, 5, stride=2, padding=2),
                                torch.nn.GELU(),
                                torch.nn.Conv1d(16, 16, 3, padding=2, dilation=2, groups=16))
    tasks = rk.extract_tasks(model.eval(), (torch.randn(1, 8, 40),), strict=True)
    convs = [t for t in tasks if t.compute.op == "conv2d"]
    assert [t.compute.inputs[1].shape[2] for t in convs] == [1, 1]
    for i, task in enumerate(convs):
        check_configs(task, 4, seed=i)


class MobileNetV3Block(torch.nn.Module):
    """Hardswish after a depthwise conv, squeeze-excite written as a spatial mean with a
    hardsigmoid gate, and stochastic-depth-style dropout: all lowered to our kernels."""

    def __init__(self):
        super().__init__()
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.act, self.gate = torch.nn.Hardswish(), torch.nn.Hardsigmoid()
        self.fc1, self.fc2 = torch.nn.Conv2d(16, 8, 1), torch.nn.Conv2d(8, 16, 1)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x):
        y = self.act(self.dw(x))
        s = self.gate(self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
        return self.drop(y * s)


def test_hardswish_hardsigmoid_and_mean_pooling_lower_to_our_kernels():
    model, x = MobileNetV3Block().eval(), torch.randn(1, 16, 8, 8)
    tasks = rk.extract_tasks(model, (x,), strict=True)  # no island: every op is ours
    ops = {e.op for t in tasks for e in t.compute.epilogue} | {t.compute.op for t in tasks}
    assert {"hardswish", "hardsigmoid", "avg_pool2d"} <= ops
    for i, task in enumerate(tasks):
        check_configs(task, 3, seed=i)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_layer", "resnet50"])
def test_many_sampled_configs_match_reference(zoo_models, name):
    for i, task in enumerate(lowerable(name, zoo_models)):
        check_configs(task, 8, seed=100 + i)


def test_bad_config_is_a_named_lowering_error(zoo_models):
    task = lowerable("resnet18", zoo_models)[2]
    assert task.compute.describe().startswith("conv2d 1x64x56x56")
    cfg = Config.of(lanes=16, ob=48, tile_h=60, tile_w=3, cb=7, spatial_order=("ko", "oh", "ow"),
                    reduce_order=("co", "kh", "kw"), parallel=1, unroll=False)
    with pytest.raises(LoweringError) as info:
        lower(task.compute, cfg)
    for knob in ("ob=48", "tile_h=60", "cb=7"):
        assert knob in str(info.value)


def test_im2col_configs_match_reference(zoo_models):
    """The alternative algorithm, sampled on purpose (it is a small part of the space)."""
    convs = [t for t in lowerable("resnet18", zoo_models)
             if t.compute.op == "conv2d" and t.compute.inputs[0].shape[1] % 8 == 0]
    assert len(convs) == 17  # every conv but the 3-channel stem
    for i, task in enumerate(convs):
        space = space_for(task.compute, cpu_info())
        im2col = dict(space.parts)["im2col"]
        cfg = space._tag("im2col", im2col.sample(random.Random(i)))
        ops = operands(task.compute, i)
        got = run_candidate(task.compute, cfg, ops, threads=2)
        assert torch.allclose(got, reference(task.compute, *ops), rtol=1e-4, atol=1e-4), cfg


def test_grouped_and_dilated_convs_match_reference():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(32, 64, 3, padding=2, dilation=2, groups=4), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, stride=2, groups=2), torch.nn.Conv2d(64, 36, 1, groups=2))
    tasks = rk.extract_tasks(model.eval(), (torch.randn(1, 32, 12, 12),))
    assert "18 output channels per group" in unsupported_reason(tasks[-1].compute)
    for i, task in enumerate(tasks[:2]):
        check_configs(task, 4, seed=i)


class Small(torch.nn.Module):
    """One small layer of every task kind, for the (slow) numpy interpreter."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.dw = torch.nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16)
        self.fc = torch.nn.Linear(16, 32)
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, x):
        y = torch.nn.functional.relu6(self.dw(torch.relu(self.conv(x))))
        y = torch.nn.functional.max_pool2d(y, 2) + torch.nn.functional.avg_pool2d(y, 2)
        z = self.ln(self.fc(y.flatten(2).transpose(1, 2)))
        return torch.softmax(torch.matmul(z, z.transpose(1, 2)), dim=-1)


def test_interpreter_defines_every_task_kind():
    tasks = rk.extract_tasks(Small().eval(), (torch.randn(1, 8, 16, 16),))
    kinds = {t.compute.op for t in tasks}
    assert kinds == {"conv2d", "max_pool2d", "avg_pool2d", "dense", "layer_norm", "matmul",
                     "softmax"}
    for i, task in enumerate(tasks):
        ops = operands(task.compute, i)
        expected = reference(task.compute, *ops)
        space = space_for(task.compute, cpu_info())
        for cfg in (space.sample(random.Random(i)), space.sample(random.Random(i + 50))):
            bufs = pack(task.compute, cfg, ops)
            interpret(lower(task.compute, cfg), bufs)
            got = unpack(task.compute, cfg, bufs["out"])
            assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), (task.compute.op, cfg)


class Ragged(torch.nn.Module):
    """Shapes no tile divides: 197 token rows (ViT-B/16), a 13x11 map, a 10-class head."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = torch.nn.Linear(64, 40), torch.nn.Linear(40, 10)
        self.conv, self.pool = torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.MaxPool2d(3, 2)

    def forward(self, x, y, q, k):
        return (self.head(torch.relu(self.fc(x))), self.pool(torch.relu(self.conv(y))),
                q @ k)


def test_tile_heights_that_do_not_divide_the_rows_get_a_tail_tile():
    inputs = (torch.randn(1, 197, 64), torch.randn(1, 8, 13, 11), torch.randn(2, 197, 24),
              torch.randn(2, 24, 64))
    tasks = rk.extract_tasks(Ragged().eval(), inputs)
    assert len(tasks) == 5
    for i, task in enumerate(tasks):
        space, rng = space_for(task.compute, cpu_info()), random.Random(i)
        rows = task.compute.output.shape[2 if task.compute.op == "conv2d" else -2]
        ragged = {c for c in (space.sample(rng) for _ in range(400))
                  if c.get("algorithm", "direct") == "direct" and rows % c["tile_h"]}
        assert ragged, task.compute.describe()  # the space offers them
        ops = operands(task.compute, i)
        expected = reference(task.compute, *ops)
        for cfg in sorted(ragged, key=str)[:4]:
            got = run_candidate(task.compute, cfg, ops, threads=2)
            assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), \
                (task.compute.describe(), cfg)


class Scores(torch.nn.Module):
    """Attention scores over token counts that no vector width divides (197: ViT-B/16's
    tokens; 5 and 20: fewer than or between vector widths), scaled, with a key bias along
    the last axis and a residual: the last vector block of each row is masked."""

    def forward(self, q, k, bias, r):
        return (q @ k.transpose(-2, -1)) * 0.125 + bias + r


@pytest.mark.parametrize("tokens", [197, 5, 20])
def test_matmuls_whose_columns_no_vector_divides_end_in_a_masked_block(tokens):
    n = tokens
    inputs = (torch.randn(2, 7, 24), torch.randn(2, n, 24), torch.randn(n), torch.randn(2, 7, n))
    task = next(t for t in rk.extract_tasks(Scores().eval(), inputs) if t.compute.op == "matmul")
    space, rng = space_for(task.compute, cpu_info()), random.Random(n)
    masked = {c for c in (space.sample(rng) for _ in range(300)) if n % c["ob"]}
    assert masked  # the space offers blocks that do not divide N
    for cfg, nest in check_natively_and_interpreted(task, sorted(masked, key=str)[:5]):
        assert any(t.mask for t in nest.tiles) == bool(n % cfg["lanes"]), cfg


def check_natively_and_interpreted(task, configs, native=True):
    """Each config's kernel (natively, unless not `native`) and its loop nest
    (interpreted) against the reference; yields each config with its nest."""
    ops = operands(task.compute, 0)
    expected = reference(task.compute, *ops)
    for cfg in configs:
        nest = lower(task.compute, cfg)
        if native:
            got = run_candidate(task.compute, cfg, ops, threads=2)
            assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), cfg
        bufs = pack(task.compute, cfg, ops)
        interpret(nest, bufs)
        assert torch.allclose(unpack(task.compute, cfg, bufs["out"]), expected,
                              rtol=1e-4, atol=1e-4), cfg
        yield cfg, nest


class Rows(torch.nn.Module):
    """A softmax, a layer norm with a GELU after it and a sum over rows of 60 floats,
    which no 8- or 16-float vector divides (Whisper's rows of 1500 frames, ViT's 197)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(60)

    def forward(self, x):
        return torch.softmax(x, -1) + torch.nn.functional.gelu(self.norm(x)) + \
            x.sum(-1, keepdim=True)


def test_rows_no_wide_vector_divides_end_in_a_partial_vector_or_run_in_4_floats():
    """Rows of 60: the CPU's widths end each row in a masked vector (12 of 16 lanes, 4 of
    8), 4-float vectors divide it; every config natively and interpreted."""
    x = torch.randn(2, 7, 60)
    tasks = rk.extract_tasks(Rows().eval(), (x,))
    cpu = cpu_info()
    seen = set()
    for task in tasks:
        space = space_for(task.compute, cpu)
        configs = list(dict.fromkeys(space.sample(random.Random(s)) for s in range(60)))
        assert {c["lanes"] for c in configs} == {*cpu.lanes, 4, 1}, task.compute.describe()
        for cfg, nest in check_natively_and_interpreted(task, configs):
            seen.add((task.compute.op, cfg["lanes"]))
    for lanes in (*cpu.lanes, 4):
        assert {op for op, w in seen if w == lanes} >= {"softmax", "layer_norm", "reduce"}


class Head(torch.nn.Module):
    """A conv, a depthwise conv or a max pool whose channels fill 8-lane vectors but not
    16-lane ones (24, 40, 72: MobileNets' and EfficientNets' narrow stages), with a bias,
    a residual and a ReLU where it has them."""

    def __init__(self, op, k):
        super().__init__()
        self.op = op
        self.conv = torch.nn.Conv2d(16 if op == "conv" else k, k, 3, padding=1,
                                    groups=1 if op == "conv" else k)

    def forward(self, x, r):
        if self.op == "max":
            return torch.nn.functional.max_pool2d(x, 3, 1, 1)
        return torch.relu(self.conv(x) + r)


@pytest.mark.parametrize("op,k", [("conv", 24), ("conv", 40), ("depthwise", 72),
                                  ("max", 40)])
def test_channels_16_lanes_do_not_tile_end_in_a_masked_nhwc_block(op, k):
    """Where the host has no 16-lane vectors the kernels are checked by the interpreter
    alone, on the space a 16-lane CPU would have."""
    import dataclasses
    inputs = (torch.randn(1, 16 if op == "conv" else k, 9, 10), torch.randn(1, k, 9, 10))
    task = next(t for t in rk.extract_tasks(Head(op, k).eval(), inputs)
                if t.compute.op in ("conv2d", "max_pool2d"))
    host = cpu_info()
    native = 16 in host.lanes
    cpu = host
    if 16 not in host.lanes:  # a 16-lane unit like the host's 8-lane one
        wide = dataclasses.replace(host.machine.unit(8), lanes=16)
        machine = dataclasses.replace(host.machine, units=host.machine.units + (wide,))
        cpu = dataclasses.replace(host, lanes=(16,) + tuple(host.lanes), machine=machine)
    space, rng = space_for(task.compute, cpu), random.Random(k)
    direct = [c for c in (space.sample(rng) for _ in range(400))
              if c.get("algorithm", "direct") == "direct"]
    masked = {c for c in direct if k % c["ob"]}
    assert masked and all(c["out_layout"] == "nhwc" for c in direct if c["lanes"] == 16)
    assert any(c["out_layout"] == "blocked" for c in direct if c["lanes"] == 8)
    for cfg, nest in check_natively_and_interpreted(task, sorted(masked, key=str)[:5],
                                                    native):
        assert any(t.mask for t in nest.tiles), cfg
    bad = Config(tuple(sorted({**dict(next(iter(masked)).knobs), "out_layout": "blocked"}
                              .items())))
    with pytest.raises(LoweringError, match="written NHWC only"):
        lower(task.compute, bad)


class HeadScaled(torch.nn.Module):
    """Swin V2's cosine attention: scores of (1, heads, T, T) times a per-head scale of
    shape (heads, 1, 1), then a standalone op with an operand along the last axis whose
    length equals the head count (a (C,) operand broadcasts along W, not C)."""

    def __init__(self, heads=8):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.rand(heads, 1, 1) + 0.5)
        self.along = torch.nn.Parameter(torch.randn(heads))

    def forward(self, q, k):
        s = (q @ k.transpose(-2, -1)) * self.scale
        return torch.softmax(s, dim=-1)[..., :8] * self.along


def test_epilogue_operands_broadcast_on_the_right_axis():
    from raytune_kernels.compile.api import compile_network
    torch.manual_seed(0)
    model, q, k = HeadScaled().eval(), torch.randn(1, 8, 16, 16), torch.randn(1, 8, 16, 16)
    with pytest.warns(UserWarning):
        net = compile_network(model, (q, k))
    q2, k2 = torch.randn(1, 8, 16, 16), torch.randn(1, 8, 16, 16)
    with torch.no_grad():
        assert torch.allclose(net(q2, k2), model(q2, k2), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("op", ["mish", "exp", "erf", "sqrt", "rsqrt", "square", "neg", "abs",
                                "gelu", "sigmoid", "tanh", "silu", "softplus"])
def test_epilogue_math_matches_torch_over_a_wide_range(op):
    """Each unary op in the LLVM kernel (a dense's epilogue) on values from -40 to 40:
    overflow, underflow and the tails of every approximation, against PyTorch's."""
    from raytune_kernels.task import Compute, EpilogueOp, TensorSpec
    x = torch.linspace(-40, 40, 16 * 64).reshape(64, 16)
    eye = torch.eye(16)
    compute = Compute("dense", (TensorSpec((64, 16)), TensorSpec((16, 16))),
                      TensorSpec((64, 16)), (), (EpilogueOp(op),))
    expected = reference(compute, x, eye)
    cfg = space_for(compute, cpu_info()).sample(random.Random(0))
    got = run_candidate(compute, cfg, [x, eye], threads=1)
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(got)), op
    assert torch.allclose(got[finite], expected[finite], rtol=2e-6, atol=1e-6), \
        (op, (got - expected)[finite].abs().max().item())


@pytest.mark.parametrize("op", ["mish", "exp", "erf", "gelu", "sigmoid", "tanh", "silu",
                                "softplus", "gelu_tanh", "hardswish"])
def test_epilogue_math_keeps_nan_a_nan_and_meets_the_infinities(op):
    """NaN in, NaN out, as torch: the clamps that keep exp and the reciprocals in range
    must not turn a NaN into a number (exp's gave 1.2e-38, sigmoid's 1)."""
    from raytune_kernels.task import Compute, EpilogueOp, TensorSpec
    compute = Compute("dense", (TensorSpec((2, 16)), TensorSpec((16, 16))),
                      TensorSpec((2, 16)), (), (EpilogueOp(op),))
    x = torch.tensor([[math.nan] * 16, [math.inf, -math.inf, 0.0, 1.0, -1.0, 50.0, -50.0,
                                        1e-3] * 2])
    eye = torch.eye(16)
    x[1] = x[1].nan_to_num(posinf=3e38, neginf=-3e38)  # x @ I: an infinity times 0 is NaN
    expected = reference(compute, x, eye)
    cfg = space_for(compute, cpu_info()).sample(random.Random(0))
    got = run_candidate(compute, cfg, [x, eye], threads=1)
    assert torch.isnan(got[0]).all(), (op, got[0])
    assert torch.equal(torch.isnan(expected[1]), torch.isnan(got[1])), (op, got[1])
    finite = torch.isfinite(expected[1])
    assert torch.allclose(got[1][finite], expected[1][finite], rtol=2e-6, atol=1e-6), op


def test_exp_underflows_to_zero_and_a_masked_softmax_writes_no_denormal():
    """Causal attention's masked scores (finfo.min, -inf, -1e4 added) give probabilities of
    exactly 0: never a denormal, which would cost every FMA of the next matmul a microcode
    assist. exp itself is 0 where its value would be a denormal."""
    from raytune_kernels.task import Compute, EpilogueOp, TensorSpec
    tiny = torch.finfo(torch.float32).tiny
    scores = torch.randn(4, 32, 128)
    mask = torch.ones(128, 128, dtype=torch.bool).tril()[:32]
    scores[0] = scores[0].masked_fill(~mask, torch.finfo(torch.float32).min)
    scores[1] = scores[1].masked_fill(~mask, -math.inf)
    scores[2] = scores[2] + (~mask) * -1e4
    scores[3] = scores[3] * 30.0  # scores spread wide: tiny probabilities, as torch's
    softmax = Compute("softmax", (TensorSpec((4, 32, 128)),), TensorSpec((4, 32, 128)),
                      (("dim", 2),))
    want = torch.softmax(scores, dim=-1)
    for cfg in list(dict.fromkeys(space_for(softmax, cpu_info()).sample(random.Random(s))
                                  for s in range(6))):
        got = run_candidate(softmax, cfg, [scores], threads=2)
        masked = got[:3][~mask.expand(3, -1, -1)]
        assert torch.equal(masked, torch.zeros_like(masked)), cfg
        assert bool(((got[:3] == 0) | (got[:3] >= tiny)).all()), cfg  # no denormal
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), cfg
    x = torch.linspace(-110.0, -80.0, 16 * 64).reshape(64, 16)
    exp = Compute("elementwise", (TensorSpec((64, 16)),), TensorSpec((64, 16)), (),
                  (EpilogueOp("exp"),))
    cfg = space_for(exp, cpu_info()).sample(random.Random(0))
    got = run_candidate(exp, cfg, [x], threads=1)
    assert bool(((got == 0) | (got >= tiny)).all())
    assert bool((got[x < -87.3] == 0).all()) and bool((got[x > -87.0] > 0).all())
    assert torch.allclose(got, torch.exp(x), atol=2 * tiny, rtol=2e-6)


@pytest.mark.parametrize("anchor", ["dense", "elementwise"])
@pytest.mark.parametrize("op", ["prelu", "elu"])
def test_activations_with_a_parameter_match_torch_in_tiles_and_rows(op, anchor):
    """prelu and elu on values from -40 to 40, by a scalar (LeakyReLU's slope, ELU's alpha)
    and by a tensor along the last axis (PReLU's slopes): in a dense's tile epilogue and in
    a row kernel's, by the interpreter and by the built kernel, in sampled configs."""
    from raytune_kernels.task import Compute, EpilogueOp, TensorSpec
    x = torch.linspace(-40, 40, 16 * 64).reshape(64, 16)
    epilogue = (EpilogueOp(op, scalar=0.3), EpilogueOp(op, (TensorSpec((16,)),)))
    inputs = (TensorSpec((64, 16)), TensorSpec((16, 16)))[:2 if anchor == "dense" else 1]
    compute = Compute(anchor, inputs, TensorSpec((64, 16)), (), epilogue)
    ops = [x, torch.eye(16)][:len(inputs)] + [torch.linspace(-1, 2, 16)]
    expected = reference(compute, *ops)
    for cfg in list(space_for(compute, cpu_info()).sample(random.Random(i)) for i in range(3)):
        bufs = pack(compute, cfg, ops)
        interpret(lower(compute, cfg), bufs)
        for got in (unpack(compute, cfg, bufs["out"]), run_candidate(compute, cfg, ops, 1)):
            assert torch.allclose(got, expected, rtol=2e-6, atol=1e-6), \
                (cfg, (got - expected).abs().max().item())


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("n", [48, 45])
def test_reductions_match_the_reference_in_every_config(kind, n):
    """A "reduce" row task (rows of n floats, one value out per row) with a per-row
    epilogue operand, run by the interpreter and by the built kernel in every config of
    its space (every vector width that divides the row; else each of the CPU's widths
    ending the row in a partial vector, and 1; 1 to 4 accumulators)."""
    from raytune_kernels.task import Compute, EpilogueOp, TensorSpec
    x, out = TensorSpec((3, 5, n)), TensorSpec((3, 5, 1))
    compute = Compute("reduce", (x,), out, (("kind", kind),),
                      (EpilogueOp("add", (out,)), EpilogueOp("abs")))
    ops = operands(compute, 3)
    ops[0] = ops[0] + 4.0 * (kind == "min")  # a min of positives: the sign trick must hold
    expected = reference(compute, *ops)
    space = space_for(compute, cpu_info())
    widths = {c["lanes"] for c in space}
    assert widths == (set(cpu_info().lanes) | {1} if n == 45 else set(cpu_info().lanes))
    for cfg in space:
        bufs = pack(compute, cfg, ops)
        interpret(lower(compute, cfg), bufs)
        assert torch.allclose(unpack(compute, cfg, bufs["out"]), expected, atol=1e-5), cfg
        got = run_candidate(compute, cfg, ops, threads=2)
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5), cfg


class Windows(torch.nn.Module):
    """A depthwise conv (strided, with an epilogue), a max and an average pool, on enough
    channels for several vector blocks."""

    def __init__(self, c=48):
        super().__init__()
        self.dw = torch.nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c)

    def forward(self, x):
        y = torch.nn.functional.relu6(self.dw(x))
        return torch.nn.functional.max_pool2d(y, 3, 1, 1) + \
            torch.nn.functional.avg_pool2d(y, 3, 1, 1)


@pytest.mark.parametrize("layout", ["blocked", "nhwc"])
def test_window_kernels_match_reference_in_both_layouts(layout):
    from raytune_kernels.layout.costs import layouts_of

    tasks = rk.extract_tasks(Windows().eval(), (torch.randn(1, 48, 13, 14),))
    assert {t.compute.op for t in tasks} >= {"conv2d", "max_pool2d", "avg_pool2d"}
    for i, task in enumerate(tasks):
        space, rng = space_for(task.compute, cpu_info()), random.Random(i)
        cfgs = {c for c in (space.sample(rng) for _ in range(300))
                if c["out_layout"] == layout and c["ob"] < 48}  # blocks side by side
        assert cfgs, task.compute.describe()
        ops = operands(task.compute, i)
        expected = reference(task.compute, *ops)
        for cfg in sorted(cfgs, key=str)[:3]:
            got = run_candidate(task.compute, cfg, ops, threads=2)
            assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), \
                (task.compute.describe(), cfg, (got - expected).abs().max().item())
            src, dst = layouts_of(task, cfg)
            if layout == "nhwc":
                assert dst == "NHWC" and src.startswith("NHWC"), (src, dst)
            else:
                assert dst == f"NCHW{cfg['ob']}c", dst


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return self.conv(x) + x


@pytest.mark.parametrize("layout", ["blocked", "nhwc"])
def test_kernels_write_into_a_bordered_buffer_and_leave_its_border(layout):
    """out_pad (set by compile_network, never tuned): the output lands inside a border
    that the kernel never touches (windows, direct and Winograd convs)."""
    from raytune_kernels.cpu.build import LoadedKernel, aligned
    from raytune_kernels.cpu.contraction import contraction
    from raytune_kernels.cpu.kernel import build_for
    from raytune_kernels.cpu.schedules import pack

    tasks = rk.extract_tasks(Windows().eval(), (torch.randn(1, 48, 13, 14),))
    conv = rk.extract_tasks(torch.nn.Conv2d(16, 32, 3, padding=1).eval(),
                            (torch.randn(1, 16, 8, 12),))
    cases = [(tasks[0], "direct")] + [(conv[0], a) for a in ("direct", "winograd", "winograd4")]
    for i, (task, algorithm) in enumerate(cases):
        space, rng = space_for(task.compute, cpu_info()), random.Random(i)
        part = dict(space.parts)[algorithm] if hasattr(space, "parts") else space
        cfg = next(c for c in (part.sample(rng) for _ in range(500)) if c["out_layout"] == layout)
        if hasattr(space, "parts"):
            cfg = space._tag(algorithm, cfg)
        cfg = Config(tuple(sorted(cfg.knobs + (("out_pad", (1, 2)),))))
        ops = operands(task.compute, i)
        bufs = {k: aligned(v) for k, v in pack(task.compute, cfg, ops).items()}
        bufs["out"][:] = -7.0  # the border as a consumer's transform left it
        built, nest = build_for(task.compute, cfg), lower(task.compute, cfg)
        assert built.library, built.error
        kernel = LoadedKernel(built.library, nest.name, len(nest.buffers))
        kernel([bufs[b.name].ctypes.data for b in nest.buffers], 2)
        shape = task.compute.output.shape
        lay = contraction(task.compute).out_layout(cfg)
        assert lay.pad == (1, 2) and bufs["out"].size == lay.size(shape)
        got = lay.unpack(bufs["out"], shape)
        assert torch.allclose(got, reference(task.compute, *ops), rtol=1e-4, atol=1e-4), \
            (task.compute.describe(), cfg)
        untouched = int((bufs["out"] == -7.0).sum())
        assert untouched == bufs["out"].size - math.prod(shape), (task.compute.describe(), cfg)


@pytest.mark.parametrize("layout", ["blocked", "nhwc"])
def test_a_residual_is_read_from_a_bordered_buffer_of_its_own(layout):
    """res_pad (set by compile_network, never tuned): the residual lives in the bordered
    buffer its other reader wants and the kernel reads its interior, whatever its own
    output's border (direct and Winograd convs; im2col is refused by name)."""
    from raytune_kernels.cpu.build import LoadedKernel, aligned
    from raytune_kernels.cpu.contraction import contraction
    from raytune_kernels.cpu.contraction_base import residual_cfg
    from raytune_kernels.cpu.kernel import build_for
    from raytune_kernels.cpu.schedules import pack

    task = rk.extract_tasks(Residual().eval(), (torch.randn(1, 16, 8, 12),))[-1]
    space = space_for(task.compute, cpu_info())
    shape = task.compute.output.shape
    for i, (algorithm, out_pad) in enumerate([("direct", (0, 0)), ("direct", (1, 2)),
                                              ("winograd", (0, 0)), ("winograd4", (1, 1))]):
        part, rng = dict(space.parts)[algorithm], random.Random(i)
        cfg = next(c for c in (part.sample(rng) for _ in range(500))
                   if c["out_layout"] == layout)
        pads = (("res_pad", (1, 1)),) + ((("out_pad", out_pad),) if out_pad != (0, 0) else ())
        cfg = Config(tuple(sorted(space._tag(algorithm, cfg).knobs + pads)))
        ops = operands(task.compute, i)
        bufs = {k: aligned(v) for k, v in pack(task.compute, cfg, ops).items()}
        res = contraction(task.compute).out_layout(residual_cfg(cfg))
        e = f"e{[k.kind for k in operand_kinds(task.compute)].index('output')}"
        assert res.pad == (1, 1) and bufs[e].size == res.size(shape)
        inside = res.pack(torch.ones(shape)) == 1.0  # the residual's interior
        bufs[e][~inside] = 1e6  # a border the kernel must not read
        built, nest = build_for(task.compute, cfg), lower(task.compute, cfg)
        assert built.library, built.error
        kernel = LoadedKernel(built.library, nest.name, len(nest.buffers))
        kernel([bufs[b.name].ctypes.data for b in nest.buffers], 2)
        lay = contraction(task.compute).out_layout(cfg)
        assert lay.pad == out_pad
        got = lay.unpack(bufs["out"], shape)
        assert torch.allclose(got, reference(task.compute, *ops), rtol=1e-4, atol=1e-4), \
            (algorithm, cfg)
    im2col = space._tag("im2col", dict(space.parts)["im2col"].sample(random.Random(0)))
    with pytest.raises(LoweringError, match="cannot read a bordered residual"):
        lower(task.compute, Config(tuple(sorted(im2col.knobs + (("res_pad", (1, 1)),)))))
    plain = rk.extract_tasks(torch.nn.Conv2d(16, 16, 3, padding=1).eval(),
                             (torch.randn(1, 16, 6, 10),))[0]
    cfg = space_for(plain.compute, cpu_info()).sample(random.Random(0))
    with pytest.raises(LoweringError, match="cannot read a bordered residual"):
        lower(plain.compute, Config(tuple(sorted(cfg.knobs + (("res_pad", (1, 1)),)))))


def test_prefetching_b_changes_the_code_and_not_one_bit_of_the_result():
    """prefetch_b asks for B's lines ahead of their reads (past B's end too, where a
    prefetch is harmless): the kernel with it computes exactly what the kernel without it
    does, and only outer products with a B (conv, dense, matmul) have the knob."""
    from raytune_kernels.cpu.llvm.ir import render

    model = torch.nn.Sequential(torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(64, 64, 3, padding=1, groups=64),
                                torch.nn.Flatten(), torch.nn.Linear(64 * 36, 40))
    tasks = rk.extract_tasks(model.eval(), (torch.randn(1, 32, 6, 6),))
    conv, depthwise, dense = (t.compute for t in tasks)
    assert "prefetch_b" not in space_for(depthwise, cpu_info()).names
    rng = random.Random(0)
    for compute in (conv, dense):
        space = space_for(compute, cpu_info())
        parts = dict(space.parts) if hasattr(space, "parts") else {"direct": space}
        assert parts["direct"].names >= {"prefetch_b"}
        ops = operands(compute)
        for _ in range(3):
            cfg = parts["direct"].sample(rng)
            if compute is conv and hasattr(space, "parts"):
                cfg = Config(tuple(sorted({**dict(cfg.knobs), "algorithm": "direct"}.items())))
            on = Config(tuple(sorted({**dict(cfg.knobs), "prefetch_b": 1024}.items())))
            off = Config(tuple(sorted({**dict(cfg.knobs), "prefetch_b": 0}.items())))
            assert "llvm.prefetch" in render(lower(compute, on))
            assert "llvm.prefetch" not in render(lower(compute, off))
            got = run_candidate(compute, on, ops, threads=2)
            assert torch.equal(got, run_candidate(compute, off, ops, threads=2)), cfg
            assert torch.allclose(got, reference(compute, *ops), rtol=1e-4, atol=1e-4)


class Strided(torch.nn.Module):
    """A 3x3 conv with a border, a strided 3x3 and a strided 1x1 after it."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 48, 3, stride=2, padding=1)
        self.c = torch.nn.Conv2d(48, 16, 1, stride=2)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def test_direct_convs_read_nhwc_in_channel_blocks_with_the_same_bits():
    """in_layout="nhwc" (set by compile_network, never tuned): a direct conv reads blocks of
    cb channels straight from an NHWC input, natively and interpreted, with the outputs of
    its blocked twin bit for bit; a conv whose blocks are its channels already has no twin."""
    from raytune_kernels.cpu.schedules import nhwc_reader
    from raytune_kernels.layout.costs import layouts_of

    tasks = rk.extract_tasks(Strided().eval(), (torch.randn(1, 32, 9, 11),))
    for i, task in enumerate(t for t in tasks if t.compute.op == "conv2d"):
        space, rng = space_for(task.compute, cpu_info()), random.Random(i)
        part = dict(space.parts)["direct"] if hasattr(space, "parts") else space
        channels = task.compute.inputs[0].shape[1]
        picked = {}
        for cfg in (part.sample(rng) for _ in range(400)):
            picked.setdefault(cfg["cb"], cfg)
        assert len(picked) >= 3 and channels in picked
        configs = [space._tag("direct", c) if hasattr(space, "parts") else c
                   for cb, c in sorted(picked.items()) if cb != channels]
        twins = [nhwc_reader(task.compute, c) for c in configs]
        assert nhwc_reader(task.compute, picked[channels]) is None
        for cfg, twin in zip(configs, twins):
            assert layouts_of(task, twin)[0].startswith("NHWC")
            assert layouts_of(task, twin)[1] == layouts_of(task, cfg)[1]
        list(check_natively_and_interpreted(task, twins))
        ops = operands(task.compute, 0)
        for cfg, twin in zip(configs, twins):
            assert torch.equal(run_candidate(task.compute, cfg, ops, threads=2),
                               run_candidate(task.compute, twin, ops, threads=2)), twin


def test_only_a_direct_ungrouped_conv_reads_nhwc_in_channel_blocks():
    """The knob on a grouped or depthwise conv, a Winograd conv or a dense is a named
    lowering error, as is a layout it does not know."""
    grouped = rk.extract_tasks(torch.nn.Conv2d(32, 32, 3, groups=2).eval(),
                               (torch.randn(1, 32, 8, 8),))[0]
    conv = rk.extract_tasks(torch.nn.Conv2d(16, 32, 3, padding=1).eval(),
                            (torch.randn(1, 16, 8, 12),))[0]
    dense = rk.extract_tasks(torch.nn.Linear(32, 16).eval(), (torch.randn(1, 32),))[0]
    space = space_for(conv.compute, cpu_info())
    winograd = space._tag("winograd", dict(space.parts)["winograd"].sample(random.Random(0)))
    direct = space._tag("direct", dict(space.parts)["direct"].sample(random.Random(0)))
    cases = [(grouped, space_for(grouped.compute, cpu_info()).sample(random.Random(0)),
              "nhwc", "only an ungrouped direct conv"),
             (dense, space_for(dense.compute, cpu_info()).sample(random.Random(0)), "nhwc",
              "only an ungrouped direct conv"),
             (conv, winograd, "nhwc", "cannot read its input NHWC"),
             (conv, direct, "nchw", "in_layout='nchw'")]
    for task, cfg, value, match in cases:
        knobs = tuple(kv for kv in cfg.knobs if kv[0] != "in_layout")
        with pytest.raises(LoweringError, match=match):
            lower(task.compute, Config(tuple(sorted(knobs + (("in_layout", value),)))))


@pytest.mark.parametrize("in_layout", ["blocked", "nhwc"])
def test_a_conv_of_no_padding_reads_its_input_inside_a_border(in_layout):
    """in_pad (set by compile_network, never tuned): a 1x1 conv reads the interior of a
    buffer bordered for another reader of its input, and never the border; a padded conv
    is refused by name."""
    from raytune_kernels.cpu.build import LoadedKernel, aligned
    from raytune_kernels.cpu.contraction import contraction
    from raytune_kernels.cpu.kernel import build_for
    from raytune_kernels.cpu.schedules import nhwc_reader

    for i, (stride, pad) in enumerate([(1, (1, 1)), (2, (1, 2))]):
        task = rk.extract_tasks(torch.nn.Conv2d(32, 16, 1, stride=stride).eval(),
                                (torch.randn(1, 32, 9, 10),))[0]
        space, rng = space_for(task.compute, cpu_info()), random.Random(i)
        part = dict(space.parts)["direct"] if hasattr(space, "parts") else space
        cfg = next(c for c in (part.sample(rng) for _ in range(500)) if c["cb"] < 32)
        cfg = space._tag("direct", cfg) if hasattr(space, "parts") else cfg
        if in_layout == "nhwc":
            cfg = nhwc_reader(task.compute, cfg)
        cfg = Config(tuple(sorted(cfg.knobs + (("in_pad", pad),))))
        ops = operands(task.compute, i)
        bufs = {k: aligned(v) for k, v in pack(task.compute, cfg, ops).items()}
        con = contraction(task.compute)
        hp, wp = con.padded(cfg)
        assert bufs["a"].size == 32 * hp * wp == 32 * (9 + 2 * pad[0]) * (10 + 2 * pad[1])
        ones = pack(task.compute, cfg, [torch.ones(1, 32, 9, 10)] + list(ops[1:]))["a"]
        bufs["a"][ones != 1.0] = 1e6  # a border the kernel must not read
        built, nest = build_for(task.compute, cfg), lower(task.compute, cfg)
        assert built.library, built.error
        kernel = LoadedKernel(built.library, nest.name, len(nest.buffers))
        kernel([bufs[b.name].ctypes.data for b in nest.buffers], 2)
        got = unpack(task.compute, cfg, bufs["out"])
        assert torch.allclose(got, reference(task.compute, *ops), rtol=1e-4, atol=1e-4), cfg
    padded = rk.extract_tasks(torch.nn.Conv2d(16, 16, 3, padding=1).eval(),
                              (torch.randn(1, 16, 8, 8),))[0]
    space = space_for(padded.compute, cpu_info())
    direct = space._tag("direct", dict(space.parts)["direct"].sample(random.Random(0)))
    with pytest.raises(LoweringError, match="cannot read its input inside a border"):
        lower(padded.compute, Config(tuple(sorted(direct.knobs + (("in_pad", (2, 2)),)))))


def test_the_rows_first_twin_reorders_the_split_and_keeps_every_bit():
    """schedules.rows_first_twin: a direct conv's or window's kernel whose threads split
    channel blocks or columns first gets its rows split first, the other loops in their
    order, the same layouts and bit for bit the same output; a kernel already splitting
    rows, a dense, a Winograd conv, or rows too few for the threads get none."""
    from raytune_kernels.cpu.schedules import rows_first_twin
    from raytune_kernels.layout.costs import layouts_of

    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 32, 3, padding=1, groups=32),
                                torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(32 * 16, 10))
    tasks = rk.extract_tasks(model.eval(), (torch.randn(1, 16, 8, 8),))
    rng = random.Random(0)
    for task in (t for t in tasks if t.compute.op != "dense"):
        space = space_for(task.compute, cpu_info())
        part = dict(space.parts)["direct"] if hasattr(space, "parts") else space
        tag = (lambda c: space._tag("direct", c)) if hasattr(space, "parts") else (lambda c: c)
        rows = task.compute.output.shape[2]  # at least two row tiles to split
        cfgs = [tag(c) for c in (part.sample(rng) for _ in range(300))
                if c["spatial_order"][0] == "ko" and 2 * c["tile_h"] <= rows][:3]
        assert cfgs, task.compute.describe()
        ops = operands(task.compute, 0)
        for cfg in cfgs:
            twin = rows_first_twin(task.compute, cfg, threads=2)
            order = cfg["spatial_order"]
            assert twin["spatial_order"] == ("oh", *(a for a in order if a != "oh"))
            assert {k: v for k, v in twin.knobs if k != "spatial_order"} == \
                {k: v for k, v in cfg.knobs if k != "spatial_order"}
            assert layouts_of(task, twin) == layouts_of(task, cfg)
            assert rows_first_twin(task.compute, twin, threads=2) is None
            assert torch.equal(run_candidate(task.compute, cfg, ops, threads=2),
                               run_candidate(task.compute, twin, ops, threads=2)), twin
    dense = tasks[-1].compute
    assert rows_first_twin(dense, space_for(dense, cpu_info()).sample(rng), 2) is None
    winograd = Config((("algorithm", "winograd"), ("spatial_order", ("ko", "oh", "ow"))))
    assert rows_first_twin(tasks[0].compute, winograd, 2) is None
    # the conv's 8 rows in one tile drop out of the loops: nothing to split first; in two
    # tiles they split between two threads, not four
    conv = tasks[0].compute
    space = space_for(conv, cpu_info())
    part = dict(space.parts)["direct"] if hasattr(space, "parts") else space
    cfg = next(c for c in (part.sample(rng) for _ in range(300)) if c["spatial_order"][0] == "ko")

    def with_rows(tile_h: int) -> Config:
        knobs = {**dict(cfg.knobs), "tile_h": tile_h, "tile_w": 1, "parallel": 1,
                 "spatial_order": ("ko", "oh", "ow")}
        c = Config(tuple(sorted(knobs.items())))
        return space._tag("direct", c) if hasattr(space, "parts") else c
    assert rows_first_twin(conv, with_rows(8), threads=2) is None
    assert rows_first_twin(conv, with_rows(4), threads=2) is not None
    assert rows_first_twin(conv, with_rows(4), threads=4) is None
