"""Elementwise epilogue math in LLVM IR, on <lanes x float> vectors.

exp is vectorised here (llvm.exp would become one libm call per lane): range reduction
x = n ln2 + r, a degree-6 polynomial for e^r (Cephes' expf coefficients, relative error
about 1e-7), and 2^n built in the exponent bits. erf for the exact GELU uses Abramowitz &
Stegun 7.1.26 (absolute error below 1.5e-7), its reciprocal by Newton steps (recip).
softplus is max(x, 0) + log1p(e^-|x|), with log1p(u) = 2 atanh(u / (u + 2)) by its odd
series (u <= 1, so the ratio is at most 1/3 and nine terms leave a relative error near
1e-9, with no cancellation for small u).
"""
from __future__ import annotations

from raytune_kernels.cpu.llvm.text import I32, splat, vector
from raytune_kernels.cpu.loopnest import EpiStep

_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
          1.6666665459e-1, 5.0000001201e-1)

_AS = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_P = 0.3275911


def apply(em, step: EpiStep, x, ops):
    b = em.b
    if step.op in ("add", "sub", "mul", "div", "maximum", "minimum", "prelu", "elu"):
        other = ops[0] if ops else em.const(step.scalar)
        lhs, rhs = (other, x) if step.reverse else (x, other)
        if step.op in ("maximum", "minimum"):  # NaN in, NaN out, as torch.maximum
            return nan_select(em, lhs, rhs, "maxnum" if step.op == "maximum" else "minnum")
        if step.op in PARAMETRIC:
            return PARAMETRIC[step.op](em, lhs, rhs)
        return {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}[step.op](lhs, rhs)
    if step.op == "affine":
        return em.intrinsic("fma", x, ops[0], ops[1])
    return UNARY[step.op](em, x)


EXP_FLOOR = -87.3  # exp below this is 0: its value would be a denormal or under one


def vexp(em, x):
    """e^x (Cephes' polynomial, 1-2 ulp), 0 below EXP_FLOOR: a denormal result (or one a
    softmax's division makes denormal, as the masked scores of causal attention did) made
    every FMA of the kernels that read it take a microcode assist, and the attention's
    probabilities-times-values matmul of GPT-2 ran 80x its time alone."""
    b, lanes = em.b, em.mod.nest.lanes
    under = b.fcmp_ordered("<", x, em.const(EXP_FLOOR))
    nan = b.fcmp_unordered("uno", x, x)
    x0, x = x, em.intrinsic("minnum", em.intrinsic("maxnum", x, em.const(EXP_FLOOR)),
                            em.const(88.3))
    n = em.intrinsic("floor", em.intrinsic("fma", x, em.const(1.4426950408889634),
                                           em.const(0.5)))
    r = em.intrinsic("fma", n, em.const(-0.693359375), x)
    r = em.intrinsic("fma", n, em.const(2.12194440e-4), r)
    y = em.const(_EXP_P[0])
    for c in _EXP_P[1:]:
        y = em.intrinsic("fma", y, r, em.const(c))
    y = em.intrinsic("fma", y, b.fmul(r, r), b.fadd(r, em.const(1.0)))
    bits = b.shl(b.add(b.fptosi(n, vector(I32, lanes)), splat(I32, lanes, 127)),
                 splat(I32, lanes, 23))
    y = b.select(under, em.const(0.0), b.fmul(y, b.bitcast(bits, em.mod.vt)))
    return b.select(nan, x0, y)  # the clamps made a NaN a number


def relu(em, x):
    return em.b.select(em.b.fcmp_ordered("<", x, em.const(0.0)), em.const(0.0), x)


def relu6(em, x):
    y = relu(em, x)
    return em.b.select(em.b.fcmp_ordered(">", y, em.const(6.0)), em.const(6.0), y)


def sigmoid(em, x):
    """1 / (1 + e^-x), the reciprocal by recip within its range; 0 below x = -44 (a
    value under 5.4e-20 there)."""
    b = em.b
    d = b.fadd(em.const(1.0), vexp(em, b.fsub(em.const(0.0), x)))
    far = b.fcmp_ordered(">", d, em.const(float(2 ** 64)))
    return b.select(far, em.const(0.0), recip(em, b.select(far, em.const(1.0), d)))


def tanh(em, x):
    s = sigmoid(em, em.b.fmul(x, em.const(2.0)))
    return em.b.fsub(em.b.fmul(s, em.const(2.0)), em.const(1.0))


def silu(em, x):
    return em.b.fmul(x, sigmoid(em, x))


def recip(em, d):
    """1/d for d in [1, 2^64], by FMAs alone: the estimate of the flipped exponent bits
    (within 5.1%) refined by three Newton steps (each squares the relative error), to
    within 6e-8. A vector division issues about once in 16 cycles, which made it the
    dearest step of an exact GELU over a dense's output."""
    b, lanes = em.b, em.mod.nest.lanes
    ints = vector(I32, lanes)
    r = b.bitcast(b.sub(splat(I32, lanes, _RECIP_MAGIC), b.bitcast(d, ints)), em.mod.vt)
    for _ in range(3):
        r = em.intrinsic("fma", r, em.intrinsic("fma", b.fneg(d), r, em.const(1.0)), r)
    return r


_RECIP_MAGIC = 0x7EF311C3


def below(em, x, limit: float):
    """min(x, limit) with a NaN kept a NaN (minnum would give the limit)."""
    over = em.b.fcmp_ordered(">", x, em.const(limit))
    return em.b.select(over, em.const(limit), x)


def erf(em, x):
    b = em.b
    ax = em.intrinsic("fabs", x)
    # t's argument clamped where erf is 1 in float32 anyway (recip's range); exp(-ax^2)
    # below still sees a NaN or an infinity as it is
    near = below(em, ax, 10.0)
    t = recip(em, em.intrinsic("fma", near, em.const(_P), em.const(1.0)))
    poly = em.const(_AS[-1])
    for c in reversed(_AS[:-1]):
        poly = em.intrinsic("fma", poly, t, em.const(c))
    poly = b.fmul(poly, t)
    e = vexp(em, b.fsub(em.const(0.0), b.fmul(ax, ax)))
    y = b.fsub(em.const(1.0), b.fmul(poly, e))
    return b.select(b.fcmp_ordered("<", x, em.const(0.0)), b.fsub(em.const(0.0), y), y)


def gelu(em, x):
    e = erf(em, em.b.fmul(x, em.const(0.7071067811865476)))
    return em.b.fmul(em.b.fmul(x, em.const(0.5)), em.b.fadd(em.const(1.0), e))


def gelu_tanh(em, x):
    b = em.b
    inner = b.fmul(em.const(0.7978845608028654),
                   b.fadd(x, b.fmul(em.const(0.044715), b.fmul(x, b.fmul(x, x)))))
    return b.fmul(b.fmul(x, em.const(0.5)), b.fadd(em.const(1.0), tanh(em, inner)))


def hardsigmoid(em, x):  # relu6(x + 3) / 6, as torch computes it
    return em.b.fdiv(relu6(em, em.b.fadd(x, em.const(3.0))), em.const(6.0))


def hardswish(em, x):  # x * relu6(x + 3) / 6
    return em.b.fdiv(em.b.fmul(x, relu6(em, em.b.fadd(x, em.const(3.0)))), em.const(6.0))


def nan_select(em, x, y, which: str):
    """maxnum/minnum of x and y, NaN where either is NaN (torch.maximum's rule)."""
    b = em.b
    either = b.fcmp_unordered("uno", x, y)
    return b.select(either, b.fadd(x, y), em.intrinsic(which, x, y))


def mish(em, x):
    """x * tanh(softplus(x)) = x * n / (n + 2) with n = e^x (e^x + 2); x itself past 20,
    where e^x would overflow and the ratio is 1 in float32."""
    b = em.b
    e = vexp(em, em.intrinsic("minnum", x, em.const(20.0)))
    n = b.fmul(e, b.fadd(e, em.const(2.0)))
    y = b.fmul(x, b.fdiv(n, b.fadd(n, em.const(2.0))))
    return b.select(b.fcmp_ordered(">", x, em.const(20.0)), x, y)


_ATANH = tuple(2.0 / k for k in range(17, 0, -2))  # 2/17, 2/15, ..., 2/1


def log1p_unit(em, u):
    """log(1 + u) for 0 <= u <= 1: 2 atanh(s), s = u / (u + 2), by its odd series."""
    b = em.b
    s = b.fdiv(u, b.fadd(u, em.const(2.0)))
    s2 = b.fmul(s, s)
    y = em.const(_ATANH[0])
    for c in _ATANH[1:]:
        y = em.intrinsic("fma", y, s2, em.const(c))
    return b.fmul(y, s)


def softplus(em, x):
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow, exact in both tails."""
    b = em.b
    tail = log1p_unit(em, vexp(em, b.fneg(em.intrinsic("fabs", x))))
    return b.fadd(relu(em, x), tail)


def prelu(em, x, a):
    """x where x >= 0, else a * x (NaN in, NaN out: the comparison fails, a * NaN)."""
    return em.b.select(em.b.fcmp_ordered(">=", x, em.const(0.0)), x, em.b.fmul(a, x))


def elu(em, x, a):
    """x where x > 0, else a * (e^x - 1); e^x of min(x, 0), so the other side never
    overflows."""
    b = em.b
    e = vexp(em, em.intrinsic("minnum", x, em.const(0.0)))
    neg = b.fmul(a, b.fsub(e, em.const(1.0)))
    return b.select(b.fcmp_ordered(">", x, em.const(0.0)), x, neg)


def sqrt(em, x):
    return em.intrinsic("sqrt", x)


def rsqrt(em, x):
    return em.b.fdiv(em.const(1.0), em.intrinsic("sqrt", x))


def square(em, x):
    return em.b.fmul(x, x)


def neg(em, x):
    return em.b.fneg(x)


def vabs(em, x):
    return em.intrinsic("fabs", x)


UNARY = {"relu": relu, "relu6": relu6, "sigmoid": sigmoid, "tanh": tanh, "silu": silu,
         "gelu": gelu, "gelu_tanh": gelu_tanh, "hardswish": hardswish,
         "hardsigmoid": hardsigmoid, "mish": mish, "exp": vexp, "erf": erf, "sqrt": sqrt,
         "rsqrt": rsqrt, "square": square, "neg": neg, "abs": vabs, "softplus": softplus}
# the activations with a parameter, taken as binary ops take their second operand
PARAMETRIC = {"prelu": prelu, "elu": elu}
