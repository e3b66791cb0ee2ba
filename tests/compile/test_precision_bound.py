"""The bound a network is checked within, per precision: tensor-core rounding emulated on
the CPU (report.rounded, report.rounded_gemms) and the model's own cost of it
(report.network_bound)."""
import math

import pytest
import torch
import torch.nn.functional as F

from raytune_kernels.compile.report import (network_bound, output_error, rounded,
                                            rounded_gemms)


def test_tf32_rounds_to_nearest_with_ties_away_and_keeps_what_is_not_finite():
    u = 2.0 ** -10  # tf32's unit at 1
    x = torch.tensor([1 + u / 2, 1 + u / 2 - 2 ** -23, -(1 + u / 2), 1 + 1.5 * u,
                      2 - u / 4, math.inf, -math.inf, math.nan, 0.0, -0.0, 3e38])
    got = rounded(x, "tf32")
    assert got[:5].tolist() == [1 + u, 1.0, -(1 + u), 1 + 2 * u, 2.0]
    assert got[5:7].tolist() == [math.inf, -math.inf] and math.isnan(got[7])
    assert got[8:10].tolist() == [0.0, 0.0] and math.copysign(1, got[9]) == -1
    assert math.isfinite(got[10]) and abs(got[10] / 3e38 - 1) <= 2 ** -11
    y = torch.randn(10000)
    err = ((rounded(y, "tf32") - y).abs() / y.abs()).max().item()
    assert 2 ** -13 < err <= 2 ** -11  # within half of a 10-bit mantissa's unit


def test_fp16_and_bf16_round_as_torchs_casts_and_fp16_overflows():
    y = torch.randn(1000) * 100
    assert torch.equal(rounded(y, "fp16"), y.half().float())
    assert torch.equal(rounded(y, "bf16"), y.bfloat16().float())
    assert rounded(torch.tensor([7e4]), "fp16").item() == math.inf
    ids = torch.arange(5)
    assert rounded(ids, "tf32") is ids
    with pytest.raises(ValueError, match="no tensor-core rounding for precision 'fp32'"):
        rounded(y, "fp32")
    with pytest.raises(ValueError, match="'fp8'"):
        rounded_gemms("fp8")


def test_every_gemm_rounds_its_operands_and_nothing_else_does():
    torch.manual_seed(0)
    r = lambda t: rounded(t, "tf32")  # noqa: E731
    x, w, b = torch.randn(1, 8, 6, 6), torch.randn(4, 8, 3, 3), torch.randn(4)
    dw = torch.randn(8, 1, 3, 3)
    a, m, c = torch.randn(3, 5, 7), torch.randn(3, 7, 4), torch.randn(3, 5, 4)
    lin_w = torch.randn(6, 7)
    q, k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.rand(5, 5) > 0.3
    mask.fill_diagonal_(True)
    with rounded_gemms("tf32"):
        got = {"conv": F.conv2d(x, w, b, padding=1), "module": torch.nn.functional.linear(
            a, lin_w), "matmul": a @ m, "bmm": torch.bmm(a, m),
            "baddbmm": torch.baddbmm(c, a, m), "depthwise": F.conv2d(x, dw, groups=8),
            "relu": torch.relu(x), "softmax": torch.softmax(a, -1),
            "sdpa": F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            "causal": F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    def attention(mask):
        s = (r(q) @ r(k).transpose(-2, -1)) * 8 ** -0.5
        return r(torch.softmax(s.masked_fill(~mask, -math.inf), -1)) @ r(v)
    want = {"conv": F.conv2d(r(x), r(w), b, padding=1), "module": F.linear(r(a), r(lin_w)),
            "matmul": r(a) @ r(m), "bmm": torch.bmm(r(a), r(m)),
            "baddbmm": torch.baddbmm(c, r(a), r(m)), "depthwise": F.conv2d(x, dw, groups=8),
            "relu": torch.relu(x), "softmax": torch.softmax(a, -1),
            "sdpa": attention(mask), "causal": attention(torch.ones(5, 5).tril() > 0)}
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert not torch.equal(got["conv"], F.conv2d(x, w, b, padding=1))  # it did round


class Cancelling(torch.nn.Module):
    """The difference of two nearly equal convs: what rounding costs it, over its output's
    scale, is far more than a table allows."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(16, 16, 3), torch.nn.Conv2d(16, 16, 3)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight * 1.001)
            self.b.bias.copy_(self.a.bias)

    def forward(self, x):
        return self.a(x) - self.b(x)


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_the_tensor_core_bound_is_twice_what_the_rounding_costs_where_that_is_larger(
        precision):
    torch.manual_seed(0)
    x = torch.randn(1, 16, 8, 8)
    shallow = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1)).eval()
    assert network_bound(shallow, (x,), precision) == (1e-2, "")
    model = Cancelling().eval()
    bound, why = network_bound(model, (x,), precision)
    with torch.no_grad():
        want = model(x)
        theirs = output_error(model.b(x).sub(model.a(x)).neg(), want)  # exact: ~0
        r = lambda t: rounded(t, precision)  # noqa: E731
        emulated = F.conv2d(r(x), r(model.a.weight), model.a.bias) - \
            F.conv2d(r(x), r(model.b.weight), model.b.bias)
        cost = output_error(emulated, want)
    assert theirs < 1e-5 and 2 * cost > 1e-2 and bound == pytest.approx(2 * cost)
    assert why == f"twice the {cost:.3g} {precision}'s rounding of every GEMM operand " \
                  "gives this model"
    assert network_bound(model, (x,), "fp32") == (1e-3, "")


def test_the_bf16_bound_is_twice_pytorchs_own_bf16_error_where_that_is_larger():
    """A network can lose more to bf16 than a table can say (depth, cancellation): the
    check allows twice what PyTorch's own bf16 run of the model loses, and says so."""
    torch.manual_seed(0)
    x = torch.randn(1, 16, 8, 8)
    shallow = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1)).eval()
    assert network_bound(shallow, (x,), "bf16") == (5e-2, "")
    model = Cancelling().eval()
    bound, why = network_bound(model, (x,), "bf16")
    assert model.a.weight.dtype == torch.float32  # the user's model left as it was
    with torch.no_grad():
        want = model(x)
        theirs = output_error(model.to(torch.bfloat16)(x.to(torch.bfloat16)).float(), want)
    assert 2 * theirs > 5e-2 and bound == pytest.approx(2 * theirs)
    assert f"twice the {theirs:.3g} PyTorch's own bf16" in why


def test_the_models_own_bound_is_worked_out_only_past_the_table(monkeypatch):
    """A check runs the model again (cast or rounded) only where the table's bound does
    not hold: most networks are within it."""
    from raytune_kernels.compile import report

    calls = []
    monkeypatch.setattr(report, "network_bound",
                        lambda *a: calls.append(a) or (0.5, "the model's own"))
    model, x = Cancelling().eval(), (torch.randn(1, 16, 8, 8),)
    assert report.held_to(0.004, model, x, "tf32") == (1e-2, "") and not calls
    assert report.held_to(0.02, model, x, "tf32") == (0.5, "the model's own")
    assert len(calls) == 1 and calls[0][2] == "tf32"
    assert report.held_to(math.nan, model, x, "bf16") == (0.5, "the model's own")
    assert report.held_to(0.02, model, x, "tf32", atol=1e-3) == (1e-3, "")
    assert len(calls) == 2
