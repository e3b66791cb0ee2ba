"""raytune_kernels as a torch.compile backend: reached by its name through torch's entry
point, each graph Dynamo captures (a graph break makes several) compiled by compile_network
with the module's parameters bound as constants, the results equal to eager; a graph
compile_network refuses stays PyTorch's, named in a warning."""
import warnings

import pytest
import torch

from raytune_kernels.compile.dynamo import _runner, backend, bind_parameters

compiled = []


class Broken(torch.nn.Module):
    """Two convs with a graph break between them (a Python-side print)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        print("a graph break")
        return torch.sigmoid(self.b(y)) + 1


def _spy(gm, example_inputs, **kw):
    run = backend(gm, example_inputs, **kw)
    compiled.append(run)
    return run


@pytest.mark.e2e  # two untuned compiles through Dynamo
def test_the_backend_is_found_by_name_and_matches_eager():
    torch.manual_seed(0)
    model, x = Broken().eval(), torch.randn(1, 3, 12, 12)
    torch._dynamo.reset()
    fast = torch.compile(model, backend="raytune_kernels", options={"threads": 1})
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), rtol=1e-4, atol=1e-5)
        x2 = torch.randn(1, 3, 12, 12)
        assert torch.allclose(fast(x2), model(x2), rtol=1e-4, atol=1e-5)


@pytest.mark.e2e  # two untuned compiles through Dynamo
def test_each_graph_of_a_graph_break_is_compiled_by_us():
    compiled.clear()
    torch._dynamo.reset()
    model, x = Broken().eval(), torch.randn(1, 3, 12, 12)
    with torch.no_grad():
        torch.compile(model, backend=_spy)(x)
    nets = [getattr(run, "network", None) for run in compiled]
    assert len(nets) == 2 and all(n is not None for n in nets)
    for net in nets:  # the weights are constants of ours, the data the only input
        assert len(net.graph.inputs) == 1 and net.graph.params


def test_parameters_become_constants_and_data_stays_an_input():
    got = {}

    def keep(gm, example_inputs, **kw):  # bound here: Dynamo drops its metadata after
        got["gm"], got["inputs"] = gm, example_inputs
        got["bound"] = bind_parameters(gm, example_inputs)
        return gm.forward
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval()
    with torch.no_grad():
        torch.compile(model, backend=keep)(torch.randn(1, 3, 8, 8))
    bound, slots = got["bound"]
    assert len(got["inputs"]) == 7  # 4 parameters, 2 running statistics, the data
    assert len(slots) == 1 and len(list(bound.parameters())) == 6
    data = got["inputs"][slots[0]]
    assert torch.equal(bound(data)[0], got["gm"](*got["inputs"])[0])


def test_a_call_with_gradients_runs_pytorch_and_says_so_once():
    class Graph:  # Dynamo's graph module, with the weight as an input
        def forward(self, x, w):
            return torch.nn.functional.conv2d(x, w)
    x, weight = torch.randn(1, 3, 8, 8), torch.nn.Parameter(torch.randn(4, 3, 3, 3))
    run = _runner(Graph(), lambda *a: pytest.fail("the network ran with gradients on"), [0])
    with pytest.warns(UserWarning, match="called with gradients enabled"):
        out = run(x, weight)
    assert out.requires_grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(x, weight)  # warned once only


@pytest.mark.e2e  # two untuned compiles through Dynamo
def test_a_graph_we_refuse_stays_pytorchs_with_a_warning():
    torch._dynamo.reset()
    model, x = Broken().eval(), torch.randn(1, 3, 12, 12)
    fast = torch.compile(model, backend="raytune_kernels", options={"fallback": "everything"})
    with torch.no_grad(), pytest.warns(UserWarning, match="left a graph of .* to PyTorch: "
                                                          "CompileError: fallback must be"):
        assert torch.allclose(fast(x), model(x), atol=1e-6)


def _guard_names(model, x, **options):
    """The names of the guards Dynamo keeps for `model` compiled by the backend with
    `options`, seen by a guard filter that keeps them all."""
    names = []

    def see(entries):
        names.extend(e.name for e in entries)
        return [True] * len(entries)
    torch._dynamo.reset()
    fast = torch.compile(model, backend="raytune_kernels",
                         options={"threads": 1, "guard_filter_fn": see, **options})
    with torch.no_grad():
        fast(x)
    return names, fast


def test_guards_on_bound_weights_are_dropped_and_the_rest_kept():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).eval()
    x = torch.randn(1, 3, 8, 8)
    kept, _ = _guard_names(model, x, dynamo_guards=True)
    names, fast = _guard_names(model, x)
    weights = [n for n in kept if "_parameters" in n or "_buffers" in n]
    assert weights and not [n for n in names if "_parameters" in n or "_buffers" in n]
    assert len(names) == len(kept) - len(weights)  # nothing else went
    assert any(".training" in n for n in names)
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), rtol=1e-4, atol=1e-5)
        model[1] = torch.nn.Identity()  # a changed module is still seen: Dynamo recompiles
        assert torch.allclose(fast(x), model(x), rtol=1e-4, atol=1e-5)


def test_weights_dynamo_installs_in_the_graph_are_bound_too():
    """With torch._dynamo.config.install_free_tensors, Dynamo hands the backend the
    weights as attributes of its graph module, not as inputs: they are constants of ours
    all the same (the backend raised AttributeError on them)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    torch._dynamo.reset()
    compiled.clear()
    with torch._dynamo.config.patch(install_free_tensors=True), torch.no_grad():
        fast = torch.compile(model, backend=_spy, options={"threads": 1})
        assert torch.allclose(fast(x), model(x), rtol=1e-4, atol=1e-5)
    net = compiled[-1].network
    assert len(net.graph.inputs) == 1 and net.graph.params
