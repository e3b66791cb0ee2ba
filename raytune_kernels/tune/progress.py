"""The tuning progress view: Ansor's task table, the estimated latency, a progress bar
with ETA. Live on a terminal (rich); on a log, the table every few rounds as plain text.
It is the callback that verbose=True adds to a tuning run."""
from __future__ import annotations

import math
import sys

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from raytune_kernels.tune.callbacks import Callback
from raytune_kernels.tune.result import RoundSummary, TuningResult
from raytune_kernels.tune.storage import redact


def task_table(s: RoundSummary) -> Table:
    table = Table(title=f"round {s.round}", show_lines=False, title_justify="left")
    for col, width in (("ID", 3), ("Task", 0), ("ms", 8), ("GFLOP/s", 7),
                       ("Trials", 6), ("Weight", 6)):
        if width:
            table.add_column(col, justify="right", no_wrap=True, min_width=width)
        else:
            table.add_column(col, justify="left", no_wrap=True, max_width=30,
                             overflow="ellipsis")
    for r in s.rows:
        lat = f"{r.latency_s * 1e3:.3f}" if math.isfinite(r.latency_s) else "-"
        gf = f"{r.gflops:.1f}" if r.gflops else "-"
        table.add_row(str(r.id), r.compute, lat, gf, str(r.trials), str(r.weight))
    est = f"{s.estimated_s * 1e3:.3f} ms" if math.isfinite(s.estimated_s) else "-"
    if s.torch_s and math.isfinite(s.estimated_s):
        est += f" ({s.torch_s * 1e3:.3f} ms of it PyTorch)"
    errs = ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())) or "none"
    table.caption = (f"Estimated total latency: {est} | Trials: {s.trials}/{s.budget} | "
                     f"Elapsed: {s.elapsed_s:.1f} s | errors this round: {errs}")
    return table


class ProgressView(Callback):
    def __init__(self, budget: int, console: Console | None = None, table_every: int = 5):
        self.console = console or Console(file=sys.stdout)
        self.live_mode = self.console.is_terminal
        self.table_every, self.last = table_every, None
        self.progress = Progress(TextColumn("tuning"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total} trials"),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=self.console)
        self.bar = self.progress.add_task("trials", total=budget)
        self.live = Live(console=self.console, refresh_per_second=4) if self.live_mode else None

    def __enter__(self) -> "ProgressView":
        if self.live:
            self.live.__enter__()
        return self

    def update(self, s: RoundSummary) -> None:
        self.last = s
        self.progress.update(self.bar, completed=s.trials)
        if self.live:
            self.live.update(Group(task_table(s), self.progress))
        elif s.round % self.table_every == 0:
            self.console.print(task_table(s))

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.__exit__(*exc)
        elif self.last is not None:
            self.console.print(task_table(self.last))
        self.last = None  # closing again (the driver does on an error) prints nothing more

    def on_start(self, summary: RoundSummary) -> None:
        self.__enter__()
        self.update(summary)

    def on_round(self, summary: RoundSummary) -> None:
        self.update(summary)

    def on_end(self, result: TuningResult) -> None:
        self.__exit__(None, None, None)
        of_torch = f" ({result.torch_s * 1e3:.3f} ms of it PyTorch)" if result.torch_s else ""
        where = redact(result.records) if result.records else None
        self.console.print(f"estimated latency {result.estimated_latency_s * 1e3:.3f} ms"
                           f"{of_torch} over {len(result.best)} tasks, {result.trials} trials; "
                           f"records: {where}", markup=False, highlight=False, soft_wrap=True)
