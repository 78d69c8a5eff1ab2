"""Failures, the optimal checkpoint interval and goodput (formulas.md 12.3-12.5).

Symbols (seconds; arrays broadcast over candidates): N GPUs; lambda failures per GPU-second;
M = 1/(N*lambda) the job's mean time between failures (failures independent and exponential,
so a job of N GPUs fails N times as often as one GPU); delta the time one save stalls training;
R the time from a failure to training again (restart + load); tau the compute time between
saves; W the background write of an asynchronous save.

- Young (1974), "A first order approximation to the optimum checkpoint interval", CACM 17(9):
  tau_Y = sqrt(2*delta*M).
- Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps",
  FGCS 22(3): tau_D = sqrt(2*delta*M)*[1 + sqrt(delta/(2M))/3 + (delta/(2M))/9] - delta
  for delta < 2M, else tau_D = M; and his wall-clock model (exponential failures)
  T_wall = M*e^(R/M)*(e^((tau+delta)/M) - 1)*T_solve/tau, whose efficiency T_solve/T_wall is
  the goodput: the share of wall-clock time that advances training. Daly's Figs. 3-5 values
  (M = 24 h, 6 h, 15 min with delta = 5 min, R = 10 min: tau = 117, 57, 9.1 min) are test vectors.
- Asynchronous saves [derived, frameworks_checkpoints.md 3.5 and 4.5]: delta is the staging
  copy only, the next save may not start before the background write W is done (tau >= W), and
  a failure during W loses one more interval, which costs W/M of the wall-clock time:
  goodput = efficiency * (1 - W/M).
"""

from __future__ import annotations

import numpy as np


def job_mtbf(gpus, failures_per_gpu_s: float) -> np.ndarray:
    """M = 1/(N*lambda), seconds: the job's mean time between failures. Float array."""
    return 1.0 / (np.asarray(gpus, dtype=np.float64) * failures_per_gpu_s)


def young_interval(delta, mtbf) -> np.ndarray:
    """Young's optimum compute time between saves, sqrt(2*delta*M), seconds."""
    return np.sqrt(2.0 * np.asarray(delta, dtype=np.float64) * mtbf)


def daly_interval(delta, mtbf) -> np.ndarray:
    """Daly's optimum compute time between saves (FGCS 2006), seconds:
    sqrt(2*delta*M)*(1 + x/3 + x^2/9) - delta with x = sqrt(delta/(2M)), for delta < 2M;
    M otherwise."""
    delta = np.asarray(delta, dtype=np.float64)
    mtbf = np.asarray(mtbf, dtype=np.float64)
    ratio = delta / (2.0 * mtbf)
    tau = np.sqrt(2.0 * delta * mtbf) * (1.0 + np.sqrt(ratio) / 3.0 + ratio / 9.0) - delta
    return np.where(delta < 2.0 * mtbf, tau, mtbf)


def daly_efficiency(tau, delta, restart, mtbf) -> np.ndarray:
    """T_solve/T_wall of Daly's model, tau/(M*e^(R/M)*(e^((tau+delta)/M) - 1)): the share of
    wall-clock time spent on useful compute with saves every tau seconds of compute, each
    stalling delta, and R to restart after each failure. In [0, 1]: 0 where a restart or save
    far beyond the MTBF overflows the exponentials (no progress). Broadcast arrays, seconds."""
    mtbf = np.asarray(mtbf, dtype=np.float64)
    tau = np.asarray(tau, dtype=np.float64)
    with np.errstate(over="ignore"):  # a restart or save far beyond the MTBF: efficiency 0
        return tau / (mtbf * np.exp(restart / mtbf) * np.expm1((tau + delta) / mtbf))


def interval_steps(optimal_s, step_s, background_s=0.0) -> np.ndarray:
    """Saves every n optimizer steps: n = the nearest whole number of steps to ``optimal_s``,
    at least 1 and at least ceil(background_s / step_s) (an asynchronous save's background
    write must be done before the next save starts). Float array of whole numbers."""
    step_s = np.asarray(step_s, dtype=np.float64)
    n = np.maximum(np.rint(np.asarray(optimal_s) / step_s), 1.0)
    return np.maximum(n, np.ceil(np.asarray(background_s) / step_s))


def goodput(tau, delta, restart, mtbf, background=0.0) -> np.ndarray:
    """Expected share of wall-clock time that advances training: Daly's efficiency, times
    (1 - W/M) for an asynchronous save whose background write W can be lost to a failure
    (``background`` 0 for synchronous saves, whose delta already holds the write)."""
    lost = np.minimum(np.asarray(background, dtype=np.float64) / mtbf, 1.0)
    return daly_efficiency(tau, delta, restart, mtbf) * (1.0 - lost)
