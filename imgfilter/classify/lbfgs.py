"""A small deterministic L-BFGS minimiser (NumPy, float64) with a backtracking line search.

The objective's value and gradient come from the GPU (or CPU) engine in float32 pieces;
the optimiser's own state stays in float64 on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class Result:
    x: np.ndarray
    loss: float
    grad_norm: float
    iterations: int
    evaluations: int
    reason: str


def minimize(
    fun: Callable[[np.ndarray], tuple[float, np.ndarray]],
    x0: np.ndarray,
    *,
    max_iter: int = 300,
    memory: int = 10,
    gtol: float = 1e-5,
    ftol: float = 1e-10,
    callback: Callable[[int, float, np.ndarray], None] | None = None,
) -> Result:
    """Minimise fun (returning (value, gradient)) from x0.

    Stops when the largest gradient entry is below gtol, when an iteration lowers the
    value by less than ftol * max(1, |value|), when the line search cannot lower the
    value any more (the float32 noise floor), or after max_iter iterations.
    """
    x = np.asarray(x0, dtype=np.float64).copy()
    f, g = fun(x)
    evals = 1
    s_hist: list[np.ndarray] = []
    y_hist: list[np.ndarray] = []
    reason = "max_iter"
    it = 0
    for it in range(1, max_iter + 1):
        if np.max(np.abs(g)) < gtol:
            reason = "gtol"
            it -= 1
            break
        # Two-loop recursion: d = -H g.
        q = g.copy()
        alphas = []
        for s, y in zip(reversed(s_hist), reversed(y_hist), strict=True):
            rho = 1.0 / float(y @ s)
            a = rho * float(s @ q)
            q -= a * y
            alphas.append((rho, a))
        if y_hist:
            gamma = float(s_hist[-1] @ y_hist[-1]) / float(y_hist[-1] @ y_hist[-1])
        else:
            gamma = 1.0 / max(1.0, float(np.linalg.norm(g)))
        r = gamma * q
        for (s, y), (rho, a) in zip(
            zip(s_hist, y_hist, strict=True), reversed(alphas), strict=True
        ):
            b = rho * float(y @ r)
            r += (a - b) * s
        d = -r
        slope = float(g @ d)
        if slope >= 0:  # not a descent direction: restart from steepest descent
            s_hist.clear()
            y_hist.clear()
            d = -g / max(1.0, float(np.linalg.norm(g)))
            slope = float(g @ d)
        step = 1.0
        accepted = False
        for _ in range(30):
            x_new = x + step * d
            f_new, g_new = fun(x_new)
            evals += 1
            if np.isfinite(f_new) and f_new <= f + 1e-4 * step * slope:
                accepted = True
                break
            step *= 0.5
        if not accepted:
            reason = "line search (value at float32 precision)"
            it -= 1
            break
        s = x_new - x
        y = g_new - g
        sy = float(s @ y)
        if sy > 1e-12 * float(y @ y):
            s_hist.append(s)
            y_hist.append(y)
            if len(s_hist) > memory:
                s_hist.pop(0)
                y_hist.pop(0)
        decrease = f - f_new
        x, f, g = x_new, f_new, g_new
        if callback is not None:
            callback(it, f, x)
        if decrease <= ftol * max(1.0, abs(f)):
            reason = "ftol"
            break
    return Result(x, float(f), float(np.max(np.abs(g))), it, evals, reason)
