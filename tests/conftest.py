import os
import tempfile

import pytest
import torch

from raytune_kernels import zoo
from raytune_kernels.cache import CACHE_ENV

# the suite's transform timings and libraries stay in the suite (every run starts cold);
# children (compile CLI runs, benches) inherit it
os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="rk_test_cache_")


@pytest.fixture(scope="session")
def zoo_models():
    """Each zoo model built once per session: (module, example_inputs)."""
    return {name: factory() for name, factory in zoo.MODELS.items()}


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for every test that needs actors (starting it costs seconds)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        # "local": a Ray of its own, never a cluster another process left running here
        # (ray.init() joins the one /tmp/ray/ray_current_cluster names)
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    yield ray
    ray.shutdown()


# fixtures that skip a test without a GPU: the tests that take them need one
GPU_FIXTURES = {"gpu", "gpu_arch"}


def pytest_collection_modifyitems(config, items):
    """Mark `gpu` what needs a CUDA GPU through its fixtures (the others carry the mark
    themselves), so that a GPU machine runs those alone: pytest -m gpu."""
    for item in items:
        if GPU_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.gpu)


class _FailuresAtOnce:
    """Prints each failure's report as it happens rather than at the session's end, which a
    time limit may never let pytest reach (bench/gpu_check.sh sets RK_FAILURES_AT_ONCE)."""

    def __init__(self, config):
        self.config = config

    def pytest_runtest_logreport(self, report):
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if report.failed and terminal is not None:
            terminal.write_line(f"\n{report.nodeid} failed ({report.when}):\n"
                                f"{report.longreprtext[-4000:]}")


def pytest_configure(config):
    if os.environ.get("RK_FAILURES_AT_ONCE"):
        config.pluginmanager.register(_FailuresAtOnce(config), "rk-failures-at-once")
