"""Only the measurer (and the driver, which captures the model) may import PyTorch. The
scheduler, search, cost model and builder actors run the search, the features, the
estimate, the builds and the records without it: each of those processes would otherwise
spend ~3 s of CPU importing torch at start, on the cores the tuning run shares."""
import json
import subprocess
import sys

import torch

import raytune_kernels as rk

CHILD = r"""
import json, sys
sys.modules["torch"] = None  # any import of torch in this process now fails
import actors.measure_actors, actors.pipeline, actors.tuning_actors, actors.metrics  # noqa
from raytune_kernels.backend import backend_for
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.task import Task
from raytune_kernels.tune.cost_model import CostModel, training_set
from raytune_kernels.tune.records import Record, versions
from raytune_kernels.tune.search import EvolutionarySearch, SearchOptions

backend = backend_for("llvm")
tasks = {t.key: t for t in (Task.from_json(d) for d in json.loads(sys.stdin.read()))}
records, model = [], CostModel()
for key, task in tasks.items():
    search = EvolutionarySearch(task, backend.space(task.compute), backend, 0,
                                SearchOptions())
    for i, cfg in enumerate(search.propose(3, model)):
        built = build_for(task.compute, cfg)
        assert built.error is None and built.library, built.error
        records.append(Record(key, "llvm", "cpu", cfg.to_json(), (1e-4 * (i + 1),),
                              versions=versions()))
model.fit(training_set(tasks, records, backend.featurize, {}))
search.propose(3, model)
print(len(records), versions()["torch"])
"""


def test_search_build_and_learn_never_import_torch():
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(16 * 6 * 6, 10))
    tasks = rk.extract_tasks(model.eval(), (torch.randn(1, 8, 6, 6),))
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=300, input=json.dumps([t.to_json() for t in tasks]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, version = proc.stdout.split()
    assert int(count) == 3 * len(tasks) and version == torch.__version__


def test_the_package_imports_without_torch_until_a_model_is_captured():
    code = ("import sys, raytune_kernels as rk\n"
            "assert 'torch' not in sys.modules\n"
            "rk.Graph\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True"]
