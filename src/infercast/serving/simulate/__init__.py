"""Request-level simulation of a deployment: arrivals or closed-loop clients, routing across
replicas, continuous batching with prefix caching and preemption, timed step by step by a step
timer (docs/simulate.md). Modules: :mod:`.load` (workloads, traces), :mod:`.prefix_cache`,
:mod:`.router`, :mod:`.scheduler` (one scheduler's batching), :mod:`.loop` (the event loop),
:mod:`.stats` (results), :mod:`.timer` (step timers), :mod:`.lockstep` (attention-DP ranks stepping
together), :mod:`.deploy` (wiring). HTML report: :mod:`infercast.report.simulate_html`."""

from .deploy import (
           simulate,
           simulate_disagg,
           simulate_estimator,
           simulate_estimator_disagg,
)
from .load import Workload, arrival_times, read_trace, sample_lengths, uniform_lengths
from .scheduler import UnitConfig
from .stats import SimResult, write_out
from .timer import EngineStepTimer, LinearStepTimer, StepTimer

__all__ = [
           "EngineStepTimer",
           "LinearStepTimer",
           "SimResult",
           "StepTimer",
           "UnitConfig",
           "Workload",
           "arrival_times",
           "read_trace",
           "sample_lengths",
           "simulate",
           "simulate_disagg",
           "simulate_estimator",
           "simulate_estimator_disagg",
           "uniform_lengths",
           "write_out",
]
