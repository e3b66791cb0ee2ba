"""Records on shared storage, through the real actors: a run writes its records to S3
(moto's server), and a second run started from another working directory resumes from
them, measuring no config twice and losing nothing; the network compiles from them."""
import collections
import os

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.tune.records import load_records
from tests.support.nets import Tiny as Small
from tests.support.s3 import moto_server, new_bucket, s3_uri


@pytest.mark.e2e
def test_a_run_on_s3_resumes_from_another_directory(ray_session, tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    pytest.importorskip("moto.server")
    model, x = Small().eval(), torch.randn(1, 16, 8, 8)
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    with moto_server() as endpoint:
        uri = s3_uri(endpoint, new_bucket(endpoint))
        monkeypatch.chdir(here)
        first = rk.tune_network(model, (x,), trials=8, records=uri, batch=4, verbose=False)
        before = load_records(uri).records
        monkeypatch.chdir(there)
        again = rk.tune_network(model, (x,), trials=12, records=uri, batch=4, verbose=False)
        after = load_records(uri).records
        net = rk.compile_network(model, (x,), records=uri)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)
    assert first.records == uri and len(before) == 8 and all(r.ok for r in before)
    assert again.trials == 12 and len(after) == 12 and after[:8] == before  # nothing lost
    measured = collections.Counter((r.task_key, r.config_key()) for r in after)
    assert max(measured.values()) == 1  # nothing measured twice
    assert again.estimated_latency_s <= first.estimated_latency_s
    assert os.listdir(here) == [] and os.listdir(there) == []  # nothing went to local files
