"""raytune-kernels: tune the kernels of a PyTorch network and compile it to beat PyTorch.

The names below are imported on first use (PEP 562): the actors that build, search and learn
import only the modules they need, and none of them pays for importing PyTorch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Sequence

from raytune_kernels.errors import (CaptureError, CompileError, DynamicShapeError, RaytuneError,
                                    UnknownModelError, UnknownTargetError, UnsupportedOpError)
from raytune_kernels.target import Target, parse_target
from raytune_kernels.task import Compute, EpilogueOp, Task, TensorSpec
from raytune_kernels.tune.callbacks import Callback, CallbackError
from raytune_kernels.version import __version__  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    import torch

    from raytune_kernels.compile.cpu_network import CompiledNetwork  # noqa: F401
    from raytune_kernels.frontend.capture import capture  # noqa: F401
    from raytune_kernels.frontend.graph import Graph, Node  # noqa: F401
    from raytune_kernels.frontend.partition import Partition, execute, partition  # noqa: F401

# name -> module that defines it; these modules import PyTorch.
_LAZY = {
    "capture": "raytune_kernels.frontend.capture",
    "Graph": "raytune_kernels.frontend.graph",
    "Node": "raytune_kernels.frontend.graph",
    "CompiledNetwork": "raytune_kernels.compile.cpu_network",
    "Partition": "raytune_kernels.frontend.partition",
    "execute": "raytune_kernels.frontend.partition",
    "partition": "raytune_kernels.frontend.partition",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'raytune_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def extract_tasks(model: "torch.nn.Module",
                  example_inputs: "Sequence[torch.Tensor] | torch.Tensor",
                  target: "str | Target" = "llvm", strict: bool = False) -> list[Task]:
    """Capture `model` and return its weighted tasks, in order of first appearance.

    The target is validated but does not change the tasks: keys are target-independent.
    An op without a node of its own runs as a PyTorch island (one warning names each);
    `strict` refuses it instead (UnsupportedOpError naming the op and its layer).
    """
    from raytune_kernels.frontend.capture import capture
    from raytune_kernels.frontend.partition import partition

    parse_target(target)
    return list(partition(capture(model, example_inputs, strict=strict)).tasks)


def compile_network(*args, **kwargs):
    """Compile a tuned model; see raytune_kernels.compile.api.compile_network. On a running
    Ray session the layout problem is solved in the LayoutActor (actors.driver)."""
    from actors.driver import compile_network as run

    return run(*args, **kwargs)


def tune_network(*args, **kwargs):
    """See raytune_kernels.driver.tune_network (imported lazily: it brings in Ray)."""
    from actors.driver import tune_network as run

    return run(*args, **kwargs)


tune_network.__doc__ = "Tune every task of a model; see raytune_kernels.driver.tune_network."


def tune_tasks(*args, **kwargs):
    """Tune chosen tasks; see raytune_kernels.driver.tune_tasks (imports Ray lazily)."""
    from actors.driver import tune_tasks as run

    return run(*args, **kwargs)


__all__ = [
    "Callback", "CallbackError", "CaptureError", "CompileError", "CompiledNetwork",
    "compile_network", "tune_network",
    "tune_tasks", "Compute", "DynamicShapeError", "EpilogueOp", "Graph", "Node", "Partition",
    "RaytuneError", "Target", "Task", "TensorSpec", "UnknownModelError", "UnknownTargetError",
    "UnsupportedOpError", "capture", "execute", "extract_tasks", "parse_target", "partition",
]
