"""Tune ResNet-18's kernels on a local Ray (or a cluster) and print the estimated latency.

    python examples/tune_resnet18.py                 # local Ray, 200 trials
    python examples/tune_resnet18.py --address auto  # from the head node of a Ray cluster

Rerunning continues from resnet18.jsonl: trials already measured count toward the
budget and are never measured again. Copy this script for your own model: any
nn.Module with example inputs works the same way.
"""
import argparse

import raytune_kernels as rk
from raytune_kernels import zoo


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--records", default="resnet18.jsonl")
    p.add_argument("--address", default=None)
    args = p.parse_args()
    model, inputs = zoo.resnet18()
    result = rk.tune_network(model, inputs, target="llvm", trials=args.trials,
                             records=args.records, address=args.address)
    for key, record in result.best.items():
        print(f"{key}  {record.median * 1e6:9.1f} us  {record.config}")
    print(f"estimated network latency: {result.estimated_latency_s * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
