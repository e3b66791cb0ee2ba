"""Print the weighted tasks of a zoo model and check the partition reproduces the model.

    python examples/extract_tasks.py resnet50
"""
import sys

import torch

import raytune_kernels as rk
from raytune_kernels import zoo


def main(name: str = "resnet18") -> None:
    model, inputs = zoo.load(name)
    part = rk.partition(rk.capture(model, inputs))
    for i, t in enumerate(part.tasks):
        print(f"{i:>3} {t.key} x{t.weight:<3} {t.compute.describe()}")
    with torch.no_grad():
        err = (rk.execute(part, inputs)[0] - model(*inputs)).abs().max().item()
    print(f"{len(part.tasks)} tasks; task-by-task reference run vs model: max abs error {err:.2e}")


if __name__ == "__main__":
    main(*sys.argv[1:])
