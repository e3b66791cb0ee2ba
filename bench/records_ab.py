"""One model compiled from two record sets, timed against each other in one process.

    python bench/records_ab.py resnet18 --a OLD.jsonl --b NEW.jsonl [--threads 2] [--rounds 15]

Whether more tuning, or tuning with another version of the search or the kernels, made
the network faster: a figure from two separate runs of bench/network.py mixes in the
machine's phase (on a shared VM, minutes apart, up to 1.5x). Here both networks run
interleaved, each round in turn first (bench/network.py's interleaved), and the figure is
the median and spread of the per-round ratio a / b (above 1: b is faster). Per network:
the end to end median, the estimate, and the algorithm each conv step runs. A record set
is a records file or a git revision's copy of one (REV:PATH, read with git show). Prints
one line per network, then one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from raytune_kernels.compile.api import compile_network  # noqa: E402
from raytune_kernels.cpu.build import host_cpu  # noqa: E402
from raytune_kernels.timing import median  # noqa: E402


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], check=True, capture_output=True,
                          cwd=os.path.dirname(HERE)).stdout


def in_git(spec: str) -> bool:
    """Whether a record set names a git revision's file (REV:PATH), not a path."""
    return not os.path.exists(spec) and ":" in spec


def pinned(spec: str) -> str:
    """REV:PATH with REV as its commit's short hash (HEAD moves; the hash does not)."""
    if not in_git(spec):
        return spec
    rev, path = spec.split(":", 1)
    return f"{git('rev-parse', '--short', rev).decode().strip()}:{path}"


def records_file(spec: str, workdir: str) -> str:
    """A path as it is; REV:PATH (a git revision's copy of a records file) written out."""
    if not in_git(spec):
        return spec
    out = os.path.join(workdir, f"{len(os.listdir(workdir))}.jsonl")
    with open(out, "wb") as f:
        f.write(git("show", spec))
    return out


def algorithms(net) -> dict[str, str]:
    """Conv step -> the algorithm its kernel runs, read off the kernel's name (a direct
    conv's is k_<task>, the others end in _im2col, _winograd or _winograd4)."""
    out = {}
    for s in net.steps:
        if s.kind == "kernel" and s.key and net.part.task(s.key).compute.op == "conv2d":
            suffix = s.kernel.name.rsplit("_", 1)[-1]
            out[s.name] = suffix if suffix in ("im2col", "winograd", "winograd4") \
                else "direct"
    return out


def main() -> None:
    from network import interleaved, load_model, spread

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--a", required=True, help="records (a file, or REV:PATH)")
    p.add_argument("--b", required=True, help="records (a file, or REV:PATH)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    args.a, args.b = pinned(args.a), pinned(args.b)
    cpu = host_cpu()[0]
    torch.set_num_threads(args.threads)
    model, inputs = load_model(args.model)
    nets = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key in ("a", "b"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                nets[key] = compile_network(model, inputs,
                                            records_file(getattr(args, key), tmp),
                                            threads=args.threads)
    rounds: dict[str, list[float]] = {}
    interleaved({k: (lambda n=n: n(*inputs)) for k, n in nets.items()}, args.rounds, rounds)
    out = {"bench": "records_ab", "model": args.model, "cpu": cpu, "threads": args.threads,
           "rounds": args.rounds, "a_over_b": spread([a / b for a, b in
                                                      zip(rounds["a"], rounds["b"])])}
    for key, net in nets.items():
        algos = algorithms(net)
        out[key] = {"records": getattr(args, key), "ms": round(median(rounds[key]) * 1e3, 3),
                    "estimated_ms": round(net.estimated_s * 1e3, 3),
                    "rounds_ms": [round(t * 1e3, 3) for t in rounds[key]],
                    "conv_algorithms": algos}
        counts = {a: list(algos.values()).count(a) for a in sorted(set(algos.values()))}
        print(f"{key}: {out[key]['records']}: {out[key]['ms']:.3f} ms end to end, estimate "
              f"{out[key]['estimated_ms']:.3f} ms, conv steps by algorithm {counts}")
    r = out["a_over_b"]
    print(f"a over b, per round: median {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})")
    out["torch"] = torch.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
