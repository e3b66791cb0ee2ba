"""The analytic cycle estimate: bounded by the machine's peak, latency-bound tiles cost
more, it follows the machine model it is given, and (a timing test, run with -m timing)
its order agrees with real measurements of random configs on this host."""
import math
import random
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cpu.machine import CpuInfo, VectorUnit, assumed_model, cpu_info
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.cpu.schedules import lower, space_for
from raytune_kernels.space import Config
from raytune_kernels.tune.cost_model import CostModel
from raytune_kernels.cpu.estimate import cycles
from raytune_kernels.cpu.measure import measure_built
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.tune.search import EvolutionarySearch
from raytune_kernels.backend import cpu_backend

CPU = CpuInfo("test", (16, 8), 32, assumed_model("test", (16, 8)))


def conv(c=64, hw=28, k=64):
    model = torch.nn.Conv2d(c, k, 3, padding=1).eval()
    (task,) = rk.extract_tasks(model, torch.randn(1, c, hw, hw))
    return task


def test_no_config_beats_the_fma_peak(zoo_models):
    model, inputs = zoo_models["bert_layer"]
    for task in rk.extract_tasks(model, inputs):
        space, rng = space_for(task.compute, CPU), random.Random(0)
        for cfg in (space.sample(rng) for _ in range(20)):
            nest = lower(task.compute, cfg)
            per_cycle = task.compute.flops() / cycles(nest, CPU.machine)
            pipes = CPU.machine.unit(nest.lanes).fma_per_cycle
            assert 0 < per_cycle <= 2 * pipes * nest.lanes, (task.compute.describe(), cfg)


def test_too_few_accumulators_wait_on_the_fma_latency():
    task = conv()
    base = dict(algorithm="direct", cb=16, out_layout="blocked", parallel=1,
                reduce_order=("co", "kh", "kw"), spatial_order=("ko", "oh", "ow"), unroll=True,
                lanes=8, ob=8, prefetch_b=0)
    space = space_for(task.compute, CPU)
    full = Config.of(**base, tile_h=1, tile_w=14)  # 14 accumulator chains
    assert full in space
    starved = Config.of(**base, tile_h=1, tile_w=2)  # 2 chains: below the space's minimum
    per_flop = [cycles(lower(task.compute, c), CPU.machine) for c in (full, starved)]
    assert per_flop[1] > 2 * per_flop[0]


def test_the_estimate_follows_the_machine_model():
    """7 chains starve two FMA pipes at latency 4 (8 needed) but keep one pipe at latency
    5 busy: the two-pipe model prefers 14 chains, the one-pipe model finds them equal."""
    task = conv()
    base = dict(algorithm="direct", cb=16, out_layout="blocked", parallel=1,
                reduce_order=("co", "kh", "kw"), spatial_order=("ko", "oh", "ow"), unroll=True,
                lanes=8, ob=8, tile_h=1)
    one_pipe = VectorUnit(8, fma_per_cycle=1.0, fma_latency=5.0, loads_per_cycle=2.0)
    models = {"two": CPU.machine, "one": replace(CPU.machine, units=(one_pipe,))}
    nests = [lower(task.compute, Config.of(**base, tile_w=w)) for w in (7, 14)]
    ratio = {k: cycles(nests[0], m) / cycles(nests[1], m) for k, m in models.items()}
    assert ratio["two"] > 1.05 and ratio["one"] == pytest.approx(1.0, abs=0.02), ratio


@pytest.mark.timing
def test_estimate_orders_real_measurements():
    """On 24 random configs of a convolution built and timed here, the estimate ranks
    them in nearly the measured order (rank correlation 0.7 to 0.95 over ResNet-18's
    convolutions at 160 configs each)."""
    task, cpu = conv(), cpu_info()
    space, rng = space_for(task.compute, cpu), random.Random(1)
    cfgs = list(dict.fromkeys(space.sample(rng) for _ in range(40)))[:24]
    opts = MeasureOptions(threads=1, min_repeat_ms=2, repeats=3)
    times, estimates = [], []
    for cfg in cfgs:
        built = build_for(task.compute, cfg)
        result = measure_built(task.compute, cfg, built.library, opts, built.seconds)
        assert result.ok, result.error_msg
        times.append(result.median)
        estimates.append(cycles(lower(task.compute, cfg), cpu.machine))
    ranks = [np.argsort(np.argsort(v)) for v in (estimates, times)]
    assert np.corrcoef(*ranks)[0, 1] > 0.5


def test_untrained_search_ranks_by_the_estimate_and_sample_stays_random():
    task = conv()
    search = EvolutionarySearch(task, space_for(task.compute, CPU), cpu_backend(CPU), seed=3)
    guided = search.propose(8, CostModel())
    blind = search.sample(64)
    cost = lambda cfgs: sorted(cycles(lower(task.compute, c), CPU.machine)  # noqa: E731
                               for c in cfgs)
    # the 7 estimate-ranked picks (one of 8 is the random epsilon) beat a random sample
    assert cost(guided)[6] < cost(blind)[len(blind) // 4]
    assert len(set(guided)) == 8 and len(set(blind)) == 64


@pytest.mark.parametrize("arch", ["sm_90"])
def test_gpu_search_without_a_model_explores_at_random(arch):
    pytest.importorskip("cupy")
    from raytune_kernels.backend import backend_for

    task, backend = conv(), backend_for(f"cuda -arch={arch}")
    space = backend.space(task.compute)
    search = EvolutionarySearch(task, space, backend, seed=0)
    got = search.propose(8, CostModel())
    assert len(set(got)) == 8 and all(c in space for c in got)


def test_a_map_group_is_costed_as_rendered_each_shared_subexpression_once():
    from raytune_kernels.cpu.estimate import _exprs_cost
    from tests.cpu.test_llvm_ir import shared_group

    exprs = tuple(e for _, e in shared_group().body[0].outs)
    assert _exprs_cost(exprs, shared=True) == (3.0, 2)  # x + y, 2 (x + y), ... - x
    assert _exprs_cost(exprs, shared=False) == (4.0, 5)  # as separate Maps would do


def dense_task(k: int, n: int = 512, m: int = 128):
    (task,) = rk.extract_tasks(torch.nn.Linear(k, n), torch.randn(1, m, k))
    return task


def dense_cfg(ob: int, rows: int, parallel: int = 2, order=("ko", "oh")) -> Config:
    return Config.of(cb=16, lanes=16, ob=ob, parallel=parallel, reduce_order=("co",),
                     spatial_order=order, tile_h=rows, tile_w=1)


def test_memory_is_priced_at_the_machines_bandwidths():
    """Weights re-read per row tile (2.25 MiB, past L2) cost their passes at the model's L3
    bandwidth, and their first read from memory (by each of the two threads that share out
    the rows) their bytes at its memory bandwidth: halving either bandwidth adds what those
    bytes cost at the new one."""
    task = dense_task(768, 768)
    nest = lower(task.compute, dense_cfg(32, 8, order=("oh", "ko")))
    base = CPU.machine
    slow_l3 = replace(base, l3_bytes_per_cycle=base.l3_bytes_per_cycle / 2)
    slow_memory = replace(base, dram_bytes_per_cycle=base.dram_bytes_per_cycle / 2)
    weights = 768 * 768 * 4
    assert cycles(nest, slow_l3, 2) - cycles(nest, base, 2) > \
        0.5 * weights / (2 * base.l3_bytes_per_cycle)
    assert cycles(nest, slow_memory, 2) - cycles(nest, base, 2) == \
        pytest.approx(2 * weights / base.dram_bytes_per_cycle, rel=0.01)


def _memory_free(monkeypatch) -> None:
    """The tests' CPU with memory infinitely fast: the weights' first read costs nothing."""
    machine = replace(CPU.machine, dram_bytes_per_cycle=math.inf)
    monkeypatch.setattr(sys.modules[__name__], "CPU", replace(CPU, machine=machine))


def per_flop(k: int, cfg: Config, n: int = 512, threads: int = 1) -> float:
    task = dense_task(k, n)
    return cycles(lower(task.compute, cfg), CPU.machine, threads) / task.compute.flops()


def test_tile_rows_that_share_an_l1_set_cost_misses():
    """8 rows of A 8 KiB apart fall in one set of an 8-way L1: every broadcast misses.
    The same tile over rows 3 KiB apart spreads over the sets and costs its FMAs only."""
    tile = dense_cfg(32, 8)
    assert per_flop(2048, tile) > 1.2 * per_flop(768, tile)
    assert per_flop(768, tile) == pytest.approx(per_flop(768, dense_cfg(64, 5)), rel=0.1)


def test_rows_beyond_the_prefetched_streams_and_short_wide_tiles_cost_more():
    """On a core whose prefetchers keep 8 rows ahead, 16 rows of one vector wait on their
    A lines; 2 rows of 4 vectors wait on their B lines; 8 rows of 2 vectors keep the FMA
    pipes busy. On a core that keeps 28 rows ahead, the 16 rows cost their FMAs only."""
    assert CPU.machine.a_streams == 8
    good = per_flop(768, dense_cfg(32, 8))
    assert per_flop(768, dense_cfg(16, 16)) > 1.3 * good
    assert per_flop(768, dense_cfg(64, 2)) > 1.3 * good
    task = dense_task(768, 512)
    nest = lower(task.compute, dense_cfg(16, 16))
    keeps_up = replace(CPU.machine, a_streams=28)
    fmas = 128 * 768 * (512 // 16) / keeps_up.unit(16).fma_per_cycle
    assert cycles(nest, keeps_up) < 1.1 * fmas + _memory_cycles(nest, keeps_up) < \
        cycles(nest, CPU.machine)


def _memory_cycles(nest, machine) -> float:
    """The cycles a nest's estimate gives its weights' first read from memory."""
    return cycles(nest, machine) - cycles(nest, replace(machine, dram_bytes_per_cycle=math.inf))


def test_weights_reread_per_row_tile_cost_their_traffic_once_they_outgrow_l2(monkeypatch):
    """Row tiles outside output blocks read all of a 2.25 MiB weight once per row tile;
    output blocks outside read each block's panel once. A 0.75 MiB weight stays in L2.
    (The first read from memory, which a thread's share of the rows makes twice, is priced
    apart: test_weights_read_by_every_thread_are_priced_from_memory.)"""
    _memory_free(monkeypatch)

    def gap(n: int) -> float:
        inside = per_flop(768, dense_cfg(32, 8, order=("oh", "ko")), n, threads=2)
        return inside / per_flop(768, dense_cfg(32, 8, order=("ko", "oh")), n, threads=2)
    assert gap(768) > 1.15
    assert gap(256) == pytest.approx(1.0, abs=0.02)


def test_threads_share_a_parallel_loop_and_pay_for_opening_it():
    (big,) = rk.extract_tasks(torch.nn.Softmax(-1), torch.randn(1, 12, 128, 128))
    (small,) = rk.extract_tasks(torch.nn.Softmax(-1), torch.randn(1, 4, 32))
    cost = lambda task, parallel, threads: cycles(lower(  # noqa: E731
        task.compute, Config.of(accs=4 if task is big else 2, lanes=16, parallel=parallel)),
        CPU.machine, threads)
    assert cost(big, True, 2) < 0.6 * cost(big, False, 2)
    assert cost(big, True, 1) == cost(big, False, 1)
    assert cost(small, True, 2) > cost(small, False, 2)


def test_an_uneven_parallel_split_costs_the_busiest_thread(monkeypatch):
    """Compute only: the weights' bytes from memory are the same at either thread count."""
    _memory_free(monkeypatch)
    task = dense_task(512, n=48 * 3)  # three 48-wide blocks over two threads
    cfg = Config.of(cb=16, lanes=16, ob=48, parallel=1, reduce_order=("co",),
                    spatial_order=("ko", "oh"), tile_h=9, tile_w=1)
    one, two = (cycles(lower(task.compute, cfg), CPU.machine, t) for t in (1, 2))
    assert two == pytest.approx(2 / 3 * one, rel=0.05)


def test_weights_read_by_every_thread_are_priced_from_memory(zoo_models):
    """A Winograd GEMM whose parallel loop shares out its tiles (which the transformed
    weights do not depend on) reads all 17 MB of them in each thread; one that shares out
    the transformed positions reads each once. Compute is alike, memory is not."""
    from raytune_kernels.backend import backend_for
    from raytune_kernels.cpu.estimate import cycles
    from raytune_kernels.cpu.machine import cpu_info
    from raytune_kernels.cpu.schedules import lower
    from raytune_kernels.space import Config

    model, inputs = zoo_models["resnet18"]
    task = next(t for t in rk.extract_tasks(model, inputs) if t.compute.describe().startswith(
        "conv2d 1x512x7x7 -> 512ch k3x3 s1"))
    machine = cpu_info().machine
    dram = machine.dram_bytes_per_cycle
    base = dict(algorithm="winograd", lanes=8, ob=32, tile_h=8, cb=64, out_layout="blocked",
                parallel=1)
    by_position = lower(task.compute, Config.of(**base, spatial_order=("xi", "ko", "pt")))
    by_tile = lower(task.compute, Config.of(**base, spatial_order=("pt", "ko", "xi")))
    u_bytes = 16 * 512 * 512 * 4
    assert cycles(by_position, machine, 2) >= u_bytes / dram
    assert cycles(by_tile, machine, 2) >= 2 * u_bytes / dram
    assert cycles(by_tile, machine, 2) - cycles(by_position, machine, 2) >= \
        0.9 * u_bytes / dram  # the second thread's copy, and little else
    # the search's estimate prices at the tuner's thread count
    x, cost = backend_for("llvm", threads=2).analyze(task.compute, [Config.of(
        **base, spatial_order=("pt", "ko", "xi"))])
    assert cost[0] == cycles(by_tile, cpu_info().machine, 2)
