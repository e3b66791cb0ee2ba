"""Tune a network's kernels from a driver submitted to a Ray cluster with `ray job submit`.

    ray start --head                      # or `ray up cluster.yaml`
    ray job submit --address http://127.0.0.1:8265 --working-dir examples -- \\
        python tune_on_cluster.py --records s3://my-bucket/tuning/resnet18/ --trials 2000

A job's driver runs in a temporary copy of the working directory (in Ray's session
directory on the head): give the records as a storage URI (file:///abs/dir/, s3://, gs://)
or an absolute path on the head, never a relative one, or they stay in that copy.
Submitting again with the same --records resumes. The target is cuda when the cluster
has GPUs, else llvm.
"""
import argparse
import os

import ray

import raytune_kernels as rk
from raytune_kernels import zoo


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--records", default=os.environ.get("RK_RECORDS"),
                   help="storage URI or absolute path (default: $RK_RECORDS)")
    p.add_argument("--model", default="resnet18", help="zoo name or path/to/file.py:factory")
    p.add_argument("--trials", type=int, default=200)
    args = p.parse_args()
    if not args.records or ("://" not in args.records and not os.path.isabs(args.records)):
        p.error("--records must outlive the job: a storage URI or an absolute path")

    ray.init(address="auto")  # the cluster this job was submitted to
    target = "cuda" if ray.cluster_resources().get("GPU", 0) >= 1 else "llvm"
    model, inputs = zoo.load(args.model)
    result = rk.tune_network(model, inputs, target=target, trials=args.trials,
                             records=args.records, address="auto")
    print(f"{target}: {result.trials} trials, estimated network latency "
          f"{result.estimated_latency_s * 1e3:.3f} ms, records in {args.records}")
    try:
        print(result.to_dataframe().to_string())  # one row per task (needs pandas)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
