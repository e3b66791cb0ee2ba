import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for every actor test (starting it costs seconds)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    yield ray
    ray.shutdown()
