"""Queueing-theory checks of the simulator.

With ``max_num_seqs: 1``, fixed lengths, a constant step time and Poisson arrivals the
replica is an M/D/1 queue whose service time is (steps per request) × (step time): one
prefill step that samples the first token, then one decode step per further token.
"""

import numpy as np
import pytest
from scipy import stats

from simulator.run import simulate
from simulator.scenario import scenario_from_dict

STEP_S = 0.01


def md1(rate, output_tokens, n, seed=0, prompt=8):
    return scenario_from_dict({
        "name": "md1",
        "model": "llama-test",
        "hardware": {"step_time": {"constant_s": STEP_S}},
        "engine": {"max_num_seqs": 1, "max_model_len": 1024},
        "workload": {"seed": seed, "num_requests": n,
                     "arrival": {"process": "poisson", "rate": rate},
                     "prompt_tokens": {"dist": "fixed", "value": prompt},
                     "output_tokens": {"dist": "fixed", "value": output_tokens}},
    })


def test_every_queue_wait_follows_the_lindley_recursion():
    out = 3
    service = out * STEP_S
    res = simulate(md1(rate=0.7 / service, output_tokens=out, n=3000))
    df = res.requests.sort_values("arrival_s")
    arrival = df["arrival_s"].to_numpy()
    wait = np.zeros(len(arrival))
    for n in range(1, len(arrival)):
        wait[n] = max(0.0, wait[n - 1] + service - (arrival[n] - arrival[n - 1]))
    sim_wait = (df["first_scheduled_s"] - df["arrival_s"]).to_numpy()
    assert np.max(np.abs(sim_wait - wait)) < 1e-6
    assert wait.max() > 5 * service  # the check is not vacuous: real queues formed
    # E2E = wait + service exactly; TTFT = wait + one step.
    np.testing.assert_allclose(df["e2el_ms"].to_numpy() / 1e3, wait + service, atol=1e-6)
    np.testing.assert_allclose(df["ttft_ms"].to_numpy() / 1e3, wait + STEP_S, atol=1e-6)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_mean_wait_matches_pollaczek_khinchine(rho):
    n, batches = 400_000, 40
    res = simulate(md1(rate=rho / STEP_S, output_tokens=1, n=n, seed=7))
    df = res.requests.sort_values("arrival_s")
    w = (df["first_scheduled_s"] - df["arrival_s"]).to_numpy()
    w = w[n // 20:]  # drop the initial transient
    means = w[: len(w) // batches * batches].reshape(batches, -1).mean(axis=1)
    m = means.mean()
    half = stats.t.ppf(0.995, batches - 1) * means.std(ddof=1) / np.sqrt(batches)
    pk = rho * STEP_S / (2 * (1 - rho))  # M/D/1: Wq = rho S / (2 (1 - rho))
    assert half <= 0.05 * m
    assert m - half <= pk <= m + half, (m, half, pk)


def test_littles_law_holds_for_concurrency():
    out = 4
    res = simulate(md1(rate=0.75 / (out * STEP_S), output_tokens=out, n=20_000, seed=3))
    s = res.summary
    df = res.requests
    # Independent sweep: integrate the number of requests in the system over time.
    t = np.concatenate([df["arrival_s"], df["finish_s"]])
    d = np.concatenate([np.ones(len(df)), -np.ones(len(df))])
    order = np.lexsort((d, t))
    t, d = t[order], d[order]
    n_sys = np.cumsum(d)[:-1]
    span = t[-1] - t[0]
    mean_n = float(np.sum(n_sys * np.diff(t)) / span)
    lam = len(df) / span
    mean_t = float(np.mean(df["finish_s"] - df["arrival_s"]))
    assert mean_n == pytest.approx(lam * mean_t, rel=0.01)
    assert s["concurrency"]["requests_mean"] == pytest.approx(mean_n, rel=0.01)
