"""bench/scale.py on a small simulated cluster: the real head streaming rounds to simulated
GPU nodes records every trial exactly once, and keeps the GPUs busy."""
import argparse
import importlib.util
import os

import pytest

import raytune_kernels as rk
from raytune_kernels.backend import cuda_backend
from raytune_kernels.cuda.gpu import gpu_info

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _scale():
    spec = importlib.util.spec_from_file_location("bench_scale",
                                                  os.path.join(ROOT, "bench", "scale.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("search_actors", [0, pytest.param(2, marks=pytest.mark.e2e)])
def test_a_small_simulated_cluster_records_every_trial_exactly_once(ray_session, zoo_models,
                                                                    search_actors):
    scale = _scale()
    model, inputs = zoo_models["resnet18"]
    backend = cuda_backend(gpu_info("sm_90"))
    tasks = [t for t in rk.extract_tasks(model, inputs)
             if backend.unsupported(t.compute) is None][:4]
    args = argparse.Namespace(builders_per_gpu=2, trials_per_gpu=0, min_trials=60, batch=4,
                              in_flight=4.0, search_actors=search_actors)
    out = scale.run_n(10, tasks, backend, args, [0.01, 0.02], [0.03, 0.04])  # 2 nodes
    assert out["trials"] == 60 == out["records"]
    assert out["lost"] == 0 and out["duplicates"] == 0
    assert 0.0 < out["busy_fraction"] <= 1.0 and 0.0 < out["steady"]["busy_fraction"] <= 1.0
    assert out["rounds_in_flight"] == 10  # 4 trials in flight per GPU, 4 per round
    assert out["proposal_ms"]["rounds"] >= 15  # 60 trials, 4 per round


def test_the_gpu_times_are_the_h100_records_scaled_to_the_mean_asked():
    times, info = _scale().gpu_times(0.2)
    assert len(times) >= 100 and sum(times) / len(times) == pytest.approx(0.2)
    assert info["p10_s"] < info["median_s"] < 0.2 < info["p90_s"]


def test_synthetic_kernel_times_are_deterministic_and_depend_on_every_knob():
    kernel_seconds = _scale().kernel_seconds
    a = kernel_seconds("k", {"bm": 64, "bn": 32})
    assert a == kernel_seconds("k", {"bn": 32, "bm": 64})
    assert a != kernel_seconds("k", {"bm": 64, "bn": 64}) and 1e-4 <= a <= 4e-4
