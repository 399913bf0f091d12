"""Serving policy shared by the simulator and the real engine (no SimPy, no torch)."""

from .kv_cache import BlockPool, KVCacheManager
from .request import (CAPPED, CAPPED_ABOVE_MAX_MODEL_LEN, MAX_TIME_NS, NS_PER_MS, NS_PER_S,
                      Request, RequestRecord, RequestSpec, RequestState, ns_to_s, s_to_ns,
                      segments_length)
from .scheduler import (RequestRejected, ScheduledRequest, Scheduler, SchedulerConfig,
                        SchedulerStats, StepPlan)

__all__ = [
    "BlockPool", "CAPPED", "CAPPED_ABOVE_MAX_MODEL_LEN", "KVCacheManager", "MAX_TIME_NS",
    "NS_PER_MS", "NS_PER_S", "Request", "RequestRecord", "RequestRejected", "RequestSpec",
    "RequestState", "ScheduledRequest", "Scheduler", "SchedulerConfig", "SchedulerStats",
    "StepPlan", "ns_to_s", "s_to_ns", "segments_length",
]
