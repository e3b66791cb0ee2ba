"""Callbacks: what a tuning run tells the caller as it goes (a round's task table, the
round's new records, the result). They run in the caller's process, after the round's
records are written, so a callback that raises stops the run without losing any."""
from __future__ import annotations

from typing import Sequence

from raytune_kernels.errors import RaytuneError
from raytune_kernels.tune.records import Record
from raytune_kernels.tune.result import RoundSummary, TuningResult
from raytune_kernels.tune.storage import redact


class Callback:
    """Hooks of a tuning run, each a no-op here: subclass and override those you need.

    tune_network(..., callbacks=[...]) calls them in list order; the progress table of
    verbose=True is one of them (tune/progress.py ProgressView), called first."""

    def on_start(self, summary: RoundSummary) -> None:
        """Before the first round: the task table as the resumed records leave it."""

    def on_records(self, records: list[Record]) -> None:
        """The records a round measured, already written to the records file."""

    def on_round(self, summary: RoundSummary) -> None:
        """After each round (after on_records): the task table and the estimate."""

    def on_end(self, result: TuningResult) -> None:
        """After the last round, with the result tune_network returns."""


class CallbackError(RaytuneError):
    """A callback raised: the run stopped there, its records so far kept. The callback's
    own exception is the __cause__."""


def stopped(round_: int, trials: int, records: str | None) -> str:
    """Where a run stands, for a CallbackError: the rounds done and the records kept."""
    kept = f"their records are in {redact(records)}" if records else "no records file was given"
    return f"tuning stopped after round {round_}, {trials} trial(s); {kept}"


def notify(callbacks: Sequence[Callback], hook: str, value, where: str) -> None:
    """Call `hook` of every callback with `value`; the first exception stops the run as a
    CallbackError naming the callback, the hook and `where` the run stands (stopped())."""
    for cb in callbacks:
        try:
            getattr(cb, hook)(value)
        except Exception as exc:
            raise CallbackError(f"callback {type(cb).__name__}.{hook} raised "
                                f"{type(exc).__name__}: {exc} ({where})") from exc
