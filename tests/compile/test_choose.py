"""Choosing kernels (compile/choose.py): the candidates a task's records give."""
from raytune_kernels.compile.choose import candidates_from_records
from raytune_kernels.layout.costs import layouts_of
from raytune_kernels.tune.records import Record

from tests.layout.test_costs import conv_task, direct


def test_candidates_keep_the_best_record_per_layout_pair():
    task = conv_task()
    recs = [Record(task.key, "llvm", "cpu", direct(8, 32).to_json(), (3.0,)),
            Record(task.key, "llvm", "cpu", direct(8, 32).to_json(), (2.0,)),
            Record(task.key, "llvm", "cpu", direct(32, 16, "nhwc").to_json(), (5.0,)),
            Record(task.key, "llvm", "cpu", direct(1, 32).to_json(), (), "crashed")]
    cands = candidates_from_records(task, recs, layouts_of)
    assert [(c.in_layout, c.out_layout, c.seconds) for c in cands] == \
        [("NCHW8c/p1x1", "NCHW32c", 2.0), ("NHWC/p1x1", "NHWC", 5.0)]
    assert cands[0].config == direct(8, 32)
    assert candidates_from_records(task, recs, layouts_of, threads=2) == []
