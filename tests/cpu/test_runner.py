"""The native runner: one call that runs a sequence of kernels in order."""
import numpy as np

from raytune_kernels.cpu.build import LoadedKernel, aligned, build
from raytune_kernels.cpu.runner import make_runner, runner_ir

# double(x): x[0] = 2 * x[0] + 1; addto(x, y): y[0] += x[0], y[1] = threads
KERNELS = """
define void @double(ptr %x, i32 %t) {
entry:
  %v = load float, ptr %x
  %w = fmul float %v, 2.0
  %u = fadd float %w, 1.0
  store float %u, ptr %x
  ret void
}

define void @addto(ptr %x, ptr %y, i32 %t) {
entry:
  %a = load float, ptr %x
  %b = load float, ptr %y
  %s = fadd float %a, %b
  store float %s, ptr %y
  %p = getelementptr inbounds float, ptr %y, i64 1
  %tf = sitofp i32 %t to float
  store float %tf, ptr %p
  ret void
}
"""


def test_runner_ir_calls_each_kernel_with_its_arguments_from_the_table_in_order():
    text = runner_ir([1, 3])
    calls = [line.strip() for line in text.splitlines() if line.strip().startswith("call")]
    assert calls == ["call void %f0(ptr %a0_0, i32 %threads)",
                     "call void %f1(ptr %a1_0, ptr %a1_1, ptr %a1_2, i32 %threads)"]
    slots = [int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "getelementptr" in line]
    assert slots == list(range(2 + 4))  # kernel, its argument, kernel, its three


def test_a_runner_runs_real_kernels_in_order_with_the_thread_count():
    built = build(KERNELS)
    assert built.error is None
    double = LoadedKernel(built.library, "double", 1).fn
    addto = LoadedKernel(built.library, "addto", 2).fn
    x, y = aligned(np.array([3.0], np.float32)), aligned(np.array([10.0, 0.0], np.float32))
    px, py = x.ctypes.data, y.ctypes.data
    # x = 7; y = 17; x = 15; y = 32: the order matters, every argument is its own
    make_runner([(double, [px]), (addto, [px, py]), (double, [px]), (addto, [px, py])], 3)()
    assert x[0] == 15.0 and y[0] == 32.0 and y[1] == 3.0
    again = make_runner([(addto, [px, py])], 1)
    again()
    assert y[0] == 47.0 and y[1] == 1.0


def test_a_clocked_runner_runs_the_same_calls_and_stamps_each_one():
    from raytune_kernels.cpu.runner import cycles_per_second

    text = runner_ir([1, 3], clocked=True)
    # declared, then read before the first call and after each
    assert text.count("readcyclecounter()") == 1 + 3
    built = build(KERNELS)
    double = LoadedKernel(built.library, "double", 1).fn
    addto = LoadedKernel(built.library, "addto", 2).fn
    x, y = aligned(np.array([3.0], np.float32)), aligned(np.array([10.0, 0.0], np.float32))
    px, py = x.ctypes.data, y.ctypes.data
    runner = make_runner([(double, [px]), (addto, [px, py]), (double, [px])], 2)
    clocked = runner.clocked()
    stamps = clocked()
    assert x[0] == 15.0 and y[0] == 17.0 and y[1] == 2.0  # as the plain runner would
    assert len(stamps) == 4 and all(np.diff(stamps.astype(np.int64)) >= 0) and stamps[0] > 0
    per_second = cycles_per_second()
    if per_second is not None:  # a constant-rate counter: between 100 MHz and 100 GHz
        assert 1e8 < per_second < 1e11
