"""TuneRequest: one tuning run's settings, made by tune_network / tune_tasks and carried
unchanged (but for what the driver learns before the run: dataclasses.replace) to the task
scheduler actor (actors/tuning_actors.py). A frozen value of plain types, so it pickles to
the actor as it is."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from raytune_kernels.errors import TuneError
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.task import Task

if TYPE_CHECKING:
    from raytune_kernels.cpu.machine import CpuInfo
    from raytune_kernels.tune.tuner import TuneOptions

COUNTS = ("trials", "batch", "threads", "num_measurers", "num_builders", "search_actors")


@dataclass(frozen=True)
class TuneRequest:
    """The settings of one run, checked when made: every count in COUNTS a positive
    integer (None, where allowed: the default), else a TuneError naming it. The fields
    are the parameters of raytune_kernels.tune_network; `tasks` (of a captured network)
    and the last five are filled in by the driver before the scheduler actor starts."""

    target: str = "llvm"
    tasks: tuple[Task, ...] = ()
    trials: int = 200
    records: str | None = None  # made absolute by the driver (actors.driver), or a URI
    resume: bool = True
    address: str | None = None
    num_measurers: int | None = None
    num_builders: int | None = None
    search_actors: int | None = None
    batch: int = 8
    seed: int = 0
    threads: int = 1
    verbose: bool = True
    seconds: float | None = None  # no round starts after this long (None: trials alone)
    # what measures an llvm target: the CPU code is built for, the measuring CPU's name and
    # vector ISA (None on cuda: the measuring GPU names itself)
    cpu: CpuInfo | None = None
    device: str | None = None
    isa: str | None = None
    cluster: bool = False  # measurers on every node of a cluster, not this machine's cores
    torch_s: float = 0.0  # the network's PyTorch part, joined to every estimate

    def __post_init__(self) -> None:
        for name in COUNTS:
            value = getattr(self, name)
            if value is None and (name.startswith("num_") or name == "search_actors"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TuneError(f"{name} must be a positive integer, got {value!r}")
        s = self.seconds
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float))
                              or not 0 < s < float("inf")):
            raise TuneError(f"seconds must be a positive number or None, got {s!r}")

    def tune_options(self) -> TuneOptions:
        from raytune_kernels.tune.tuner import TuneOptions

        return TuneOptions(trials=self.trials, batch=self.batch, seed=self.seed,
                           threads=self.threads)

    def measure_options(self, on_gpu: bool) -> MeasureOptions:
        """How every candidate is timed; on a GPU, "cold" is an L2 flushed before every
        repeat (cuda/measure.py), on a CPU weights read from rotating copies."""
        return MeasureOptions(threads=self.threads, min_repeat_ms=10, repeats=3, timeout_s=30,
                              cold_weights=self.tune_options().cold_weights,
                              flush_cache=on_gpu)
