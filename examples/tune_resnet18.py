"""Tune ResNet-18's kernels on a local Ray (or a cluster), compile the network from the
records, and compare it with PyTorch.

    python examples/tune_resnet18.py                 # local Ray, 200 trials, 1 thread
    python examples/tune_resnet18.py --threads 2     # kernels tuned and run on 2 cores
    python examples/tune_resnet18.py --address auto  # from the head node of a Ray cluster

Rerunning continues from resnet18.jsonl: trials already measured count toward the
budget and are never measured again. Copy this script for your own model: any
nn.Module with example inputs works the same way.
"""
import argparse

import torch

import raytune_kernels as rk
from raytune_kernels import zoo


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--records", default="resnet18.jsonl")
    p.add_argument("--address", default=None)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    model, inputs = zoo.resnet18()
    result = rk.tune_network(model, inputs, target="llvm", trials=args.trials,
                             records=args.records, address=args.address, threads=args.threads)
    print(f"estimated network latency: {result.estimated_latency_s * 1e3:.2f} ms")

    # Tasks still without a record run PyTorch's kernel; so does any slower than PyTorch.
    torch.set_num_threads(args.threads)
    net = rk.compile_network(model, inputs, args.records, threads=args.threads,
                             fallback="torch")
    y = net(inputs[0])  # torch in, torch out; checked against model(x) when compiled
    ours = net.benchmark()
    print(f"compiled: {ours * 1e3:.2f} ms per inference, output {tuple(y.shape)}")
    print(net.fidelity(ours, net.profile(png="resnet18_profile.png")))


if __name__ == "__main__":
    main()
