"""The cpu_tiny case (4 req/s, 3 replications) where rounding a figure twice shows, shared
by the tests that run and compare round their replication means once."""

import numpy as np

from simulator.metrics import round_sig, summary_at
from simulator.report import fmt_number


def exact_means(runs) -> tuple[float, float]:
    """Mean goodput (req/s) and TTFT p99 (ms) of ``runs``' exact figures, after checking
    that the case is one where rounding twice differs: the goodputs 4.0316139, 4.1388863,
    4.1632497 average 4.11124997 (4.1112 at 5 figures) but their 6-figure summaries
    4.11125 (4.1113); the TTFT p99s 439.525 ms at 6 figures, 439.526 from the summaries."""
    def mean(figures, *at):
        return float(np.mean([summary_at(f, at) for f in figures]))

    exact, rounded = [r.exact for r in runs], [r.summary for r in runs]
    goodput, ttft = mean(exact, "goodput"), mean(exact, "ttft_ms", "p99")
    assert (fmt_number(goodput), fmt_number(round_sig(mean(rounded, "goodput")))) == \
        ("4.1112", "4.1113")
    assert (round_sig(ttft), round_sig(mean(rounded, "ttft_ms", "p99"))) == (439.525, 439.526)
    return goodput, ttft
