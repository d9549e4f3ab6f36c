"""What every serving model reports: the numbers a benchmark client measures."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class ServingMetrics:
    concurrency: float  # clients of one attention-DP rank (agg) or of the deployment (disagg)
    ttft_ms: float  # mean time to first token, from the client's send
    tpot_ms: float  # mean time per output token after the first
    request_latency_ms: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float

    def to_dict(self) -> dict:
        return asdict(self)
