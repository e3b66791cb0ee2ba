"""What the native runner costs between steps: a run of N kernels that do nothing but open
an OpenMP parallel region (each thread stores one float), called as a compiled network
calls its steps (cpu/runner.py), against the same run of kernels with no parallel region.
The difference per kernel is what a step pays to hand its work to the thread pool and
join it; what a network loses between its steps beyond that is its caches.

    python bench/dispatch.py [--threads 2] [--steps 64] [--repeats 15]

Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from raytune_kernels.cpu.build import LoadedKernel, build, host_cpu
from raytune_kernels.cpu.runner import make_runner

IR = """
declare void @GOMP_parallel(ptr, ptr, i32, i32)
declare i32 @omp_get_thread_num()
define internal void @body(ptr %a) {
  %t = call i32 @omp_get_thread_num()
  %i = sext i32 %t to i64
  %p = getelementptr inbounds float, ptr %a, i64 %i
  store float 1.0, ptr %p, align 4
  ret void
}
define void @forked(ptr %a, i32 %n) {
  call void @GOMP_parallel(ptr @body, ptr %a, i32 %n, i32 0)
  ret void
}
define void @serial(ptr %a, i32 %n) {
  store float 1.0, ptr %a, align 4
  ret void
}
"""


def per_step_us(name: str, library, steps: int, threads: int, repeats: int,
                buf: np.ndarray) -> list[float]:
    """Microseconds per kernel of a runner of `steps` calls of kernel `name`, one figure
    per repeat (each the mean of 200 runner calls, after 100 to warm up)."""
    fn = LoadedKernel(library, name, 1).fn
    run = make_runner([(fn, [buf.ctypes.data])] * steps, threads)
    for _ in range(100):
        run()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(200):
            run()
        out.append((time.perf_counter() - start) / 200 / steps * 1e6)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    built = build(IR, persist=False)
    if built.error:
        raise SystemExit(f"the probe kernels did not build: {built.error}")
    buf = np.zeros(256, np.float32)
    forked = per_step_us("forked", built.library, args.steps, args.threads, args.repeats, buf)
    serial = per_step_us("serial", built.library, args.steps, args.threads, args.repeats, buf)
    result = {"bench": "dispatch", "cpu": host_cpu()[0], "threads": args.threads,
              "steps": args.steps, "forked_us": round(statistics.median(forked), 3),
              "forked_us_min": round(min(forked), 3),
              "serial_us": round(statistics.median(serial), 3),
              "dispatch_us": round(statistics.median(forked) - statistics.median(serial), 3)}
    print(f"a parallel region costs {result['dispatch_us']:.2f} us a step at "
          f"{args.threads} threads on {result['cpu']} ({args.steps} steps a run)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
