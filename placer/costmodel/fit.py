"""Fitting time (or bytes) against input size, chosen by leave-one-out error.

May import: numpy, pydantic, placer.data.measures. Never torch: planning from a saved profile must stay
fast.

The family follows StarPU's regression models: ``a*n**b`` (``power``) and
``a*n**b + c`` (``power+c``), plus ``a*n + c`` (``linear``) and
``a*n*log2(n) + c`` (``nlogn``). The constant ``c`` represents fixed costs
(dispatch, kernel launch, Python overhead) so that small inputs come out right.
All forms are fitted to minimise squared *relative* error, with ``a, c >= 0``.
Among the forms with enough points, the one with the smallest validation error
wins (fewer parameters break near-ties, and a curve must be over three times better
than ``a*n + c`` to replace it), among the forms that also predict the two
largest measured sizes from the smaller ones about as well as they interpolate: a
form that blows up within the measured range is not trusted beyond it.

Examples
--------
>>> import numpy as np
>>> n = np.array([100, 200, 400, 800, 1600, 3200])
>>> fit = fit_size_model(n, 2e-3 + 1e-6 * n)
>>> fit.form in ("linear", "power+c")
True
>>> round(fit.predict(32000).value / (2e-3 + 1e-6 * 32000), 2)
1.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from placer.data.measures import Label, Prediction  # noqa: F401

Form = Literal["constant", "linear", "nlogn", "power", "power+c"]
#: parameters of each form, used to require enough points
N_PARAMS = {"constant": 1, "linear": 2, "nlogn": 2, "power": 2, "power+c": 3}
FORMS: tuple[Form, ...] = ("linear", "nlogn", "power", "power+c")
#: exponents tried for the power forms before refinement; above 2 a noisy point at the
#: top of the range extrapolates wildly, and pipeline stages are rarely worse than n**2
B_MAX = 2.0
_B_GRID = np.linspace(0.0, B_MAX, 41)
#: relative error assumed when too few points exist to estimate one
UNKNOWN_ERROR = 0.5
#: a curved form replaces ``a*n + c`` only when its leave-one-out error is below this
#: fraction of the line's: on measurements from a busy machine, curvature fitted to
#: noise extrapolates far worse than a line
LINEAR_MARGIN = 0.3
#: a form whose forward (extrapolation) error exceeds both twice its leave-one-out
#: error and this is dropped
FORWARD_SLACK = 0.3
#: a prediction beyond this factor outside the measured range is flagged
FAR_FACTOR = 10.0
#: with one measured size, the share of its time taken to be fixed cost (dispatch,
#: launches, Python): neither all of it (nothing would scale) nor none of it (the fixed
#: cost would scale with size, as a line through the origin does)
ONE_POINT_FIXED_SHARE = 0.5
#: relative error of a prediction away from the only measured size
ONE_POINT_ERROR = 1.0
#: a candidate form whose leave-one-out error is within this factor of the chosen one's (or
#: within :data:`PLAUSIBLE_FLOOR`) fits the points as well, within their noise: where it
#: disagrees with the chosen form, the prediction is that uncertain (:meth:`SizeFit.disagreement`)
PLAUSIBLE_FACTOR = 2.0
PLAUSIBLE_FLOOR = 0.02


class SizeFit(BaseModel):
    """A fitted size model ``y(n)``.

    Attributes
    ----------
    form : str
        One of :data:`FORMS` (or ``constant``).
    a, b, c : float
        Parameters: ``linear``: ``a*n + c``; ``nlogn``: ``a*n*log2(n) + c``;
        ``power``: ``a*n**b``; ``power+c``: ``a*n**b + c``; ``constant``: ``c``.
    loo_error : float
        Root-mean-square leave-one-out relative error of this form (``UNKNOWN_ERROR``
        when there were too few points to tell).
    candidates : dict
        Leave-one-out error of every form that was tried.
    n_min, n_max : float
        The measured range.
    n_points : int
    valid : bool
        Enough points to estimate the error (as StarPU's "enough measures").
    alternatives : dict
        ``[a, b, c]`` of each other candidate form that fits the points about as well
        (leave-one-out error within :data:`PLAUSIBLE_FACTOR` of the chosen form's or
        :data:`PLAUSIBLE_FLOOR`, and extrapolating within its own range): where they
        disagree, the prediction is uncertain by as much.
    """

    form: Form
    a: float = 0.0
    b: float = 1.0
    c: float = 0.0
    loo_error: float = UNKNOWN_ERROR
    candidates: dict[str, float] = Field(default_factory=dict)
    n_min: float
    n_max: float
    n_points: int
    valid: bool = True
    alternatives: dict[str, list[float]] = Field(default_factory=dict)

    def __call__(self, n: float | np.ndarray) -> float | np.ndarray:
        return _eval(self.form, self.a, self.b, self.c, np.asarray(n, dtype=float))

    def extrapolation(self, n: float) -> float:
        """Factor by which ``n`` lies outside ``[n_min, n_max]`` (1.0 inside)."""
        if n > self.n_max:
            return float(n / self.n_max)
        if 0 < n < self.n_min:
            return float(self.n_min / n)
        return 1.0

    def disagreement(self, n: float) -> float:
        """How far the :attr:`alternatives` disagree with this form at size ``n``: the largest
        ``max(alt, this) / min(alt, this) - 1`` (0 without alternatives)."""
        mine = float(max(self(n), 1e-300))
        worst = 0.0
        for form, (a, b, c) in self.alternatives.items():
            alt = float(max(_eval(form, a, b, c, np.asarray(float(n))), 1e-300))
            worst = max(worst, max(alt, mine) / min(alt, mine) - 1.0)
        return worst

    def predict(self, n: float, label: Label = "predicted") -> Prediction:
        """Predict at size ``n`` with an error estimate.

        The error is the leave-one-out error, grown by half of it again for every
        decade of extrapolation (a heuristic: errors compound with distance), or, where
        the candidate forms that fit the points as well disagree at ``n`` by more
        (:meth:`disagreement`, kept as ``fit_spread``), that disagreement.
        """
        x = self.extrapolation(n)
        err = self.loo_error * (1.0 + 0.5 * math.log10(x)) if x > 1 else self.loo_error
        spread = self.disagreement(n)
        return Prediction(
            value=float(max(self(n), 0.0)),
            rel_error=float(max(err, spread)),
            label=label,
            extrapolation=x,
            far_outside=x > FAR_FACTOR,
            fit_spread=float(spread) if spread > err else 0.0,
        )

    def describe(self) -> str:
        """The formula, e.g. ``2.1e-07*n^1.02 + 3.0e-05``."""
        if self.form == "constant":
            return f"{self.c:.3g}"
        term = {"linear": "n", "nlogn": "n*log2(n)", "power": f"n^{self.b:.3g}", "power+c": f"n^{self.b:.3g}"}
        s = f"{self.a:.3g}*{term[self.form]}"
        return s + (f" + {self.c:.3g}" if self.form != "power" else "")


def _eval(form: str, a: float, b: float, c: float, n: np.ndarray) -> np.ndarray:
    if form == "constant":
        return np.full_like(n, c, dtype=float) if n.ndim else np.float64(c)
    if form == "linear":
        return a * n + c
    if form == "nlogn":
        return a * n * np.log2(np.maximum(n, 2.0)) + c
    if form == "power":
        return a * n**b
    return a * n**b + c


def _nnls2(f: np.ndarray, g: np.ndarray | None, y: np.ndarray) -> tuple[float, float, float]:
    """Minimise sum(((a*f + c*g) - y)/y)**2 with a, c >= 0; return (a, c, sse)."""
    w = 1.0 / y
    fw, yw = f * w, y * w  # yw is all ones
    best = None
    cands = []
    if g is not None:
        gw = g * w
        A = np.stack([fw, gw], axis=1)
        sol, *_ = np.linalg.lstsq(A, yw, rcond=None)
        if sol[0] >= 0 and sol[1] >= 0:
            cands.append((float(sol[0]), float(sol[1])))
        cands.append((0.0, float(max(gw @ yw / max(gw @ gw, 1e-300), 0.0))))
    cands.append((float(max(fw @ yw / max(fw @ fw, 1e-300), 0.0)), 0.0))
    for a, c in cands:
        r = a * fw + (c * g * w if g is not None else 0.0) - yw
        sse = float(r @ r)
        if best is None or sse < best[2]:
            best = (a, c, sse)
    return best


def _fit_form(form: str, n: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-relative-squares parameters ``(a, b, c)`` of one form."""
    ones = np.ones_like(n)
    if form == "constant":
        # minimiser of sum((c - y)/y)^2
        c = float(np.sum(1 / y) / np.sum(1 / y**2))
        return 0.0, 0.0, c
    if form == "linear":
        a, c, _ = _nnls2(n, ones, y)
        return a, 1.0, c
    if form == "nlogn":
        a, c, _ = _nnls2(n * np.log2(np.maximum(n, 2.0)), ones, y)
        return a, 1.0, c
    g = ones if form == "power+c" else None
    if form == "power":  # exact in log space, then the same relative criterion
        lb = np.polyfit(np.log(n), np.log(y), 1) if len(n) > 1 else (1.0, np.log(y[0] / n[0]))
        grid = np.unique(np.clip(np.concatenate([_B_GRID, [lb[0]]]), 0.0, B_MAX))
    else:
        grid = _B_GRID

    def score(b: float) -> tuple[float, float, float]:
        return _nnls2(n**b, g, y)

    results = [(b, *score(b)) for b in grid]
    b0 = min(results, key=lambda r: r[3])[0]
    lo, hi = max(0.0, b0 - 0.05), min(B_MAX, b0 + 0.05)
    for _ in range(30):  # golden-section refinement of b
        m1, m2 = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        if score(m1)[2] < score(m2)[2]:
            hi = m2
        else:
            lo = m1
    b = (lo + hi) / 2
    a, c, sse = score(b)
    best = min(results, key=lambda r: r[3])
    if best[3] < sse:
        b, a, c = best[0], best[1], best[2]
    return float(a), float(b), float(c)


def _loo_error(form: str, n: np.ndarray, y: np.ndarray) -> float:
    errs = []
    for i in range(len(n)):
        keep = np.arange(len(n)) != i
        a, b, c = _fit_form(form, n[keep], y[keep])
        pred = float(_eval(form, a, b, c, np.asarray(n[i], dtype=float)))
        errs.append((pred - y[i]) / y[i])
    return float(np.sqrt(np.mean(np.square(errs))))


def _forward_error(form: str, n: np.ndarray, y: np.ndarray) -> float | None:
    """RMS relative error predicting each of the two largest sizes from the smaller ones.

    Leave-one-out rewards interpolation; a cost model is used to extrapolate, so
    each candidate must also predict the top of the range from below it.
    """
    sizes = np.unique(n)
    errs = []
    for top in sizes[-2:]:
        below = n < top
        if below.sum() < N_PARAMS[form] + 1 or len(np.unique(n[below])) < N_PARAMS[form]:
            continue
        a, b, c = _fit_form(form, n[below], y[below])
        at = n == top
        pred = _eval(form, a, b, c, n[at])
        errs.extend(((pred - y[at]) / y[at]).tolist())
    return float(np.sqrt(np.mean(np.square(errs)))) if errs else None


def _two_sizes(n: np.ndarray, y: np.ndarray, forms: Sequence[str], rng: dict) -> SizeFit:
    """Too few points to validate a form: the line with a fixed cost through them, unless
    they grow faster than the size (then ``a*n**b``)."""
    if "linear" in forms:
        a, b, c = _fit_form("linear", n, y)
        resid = np.abs(_eval("linear", a, b, c, n) - y) / y
        if float(resid.max()) <= 0.05:
            return SizeFit(form="linear", a=a, b=b, c=c, valid=False, **rng)
    a, b, c = _fit_form("power", n, y)
    return SizeFit(form="power", a=a, b=b, c=c, valid=False, **rng)


def fit_size_model(
    sizes: Sequence[float],
    values: Sequence[float],
    *,
    forms: Sequence[str] = FORMS,
) -> SizeFit:
    """Fit ``values`` (seconds or bytes, all > 0) against ``sizes``.

    Parameters
    ----------
    sizes, values : sequence of float
        Measured points; repeated sizes are allowed.
    forms : sequence of str
        Candidate forms; those needing more points than are available are skipped.

    Returns
    -------
    SizeFit
        The form with the least leave-one-out relative error among those whose
        forward error (predicting the two largest sizes from the smaller ones)
        stays within twice that error or :data:`FORWARD_SLACK`. With one size the
        model is ``a*n + c`` through that point with :data:`ONE_POINT_FIXED_SHARE`
        of its time fixed (never a line through the origin, which would scale the
        fixed cost with size), error :data:`ONE_POINT_ERROR`; with two sizes the
        line through both (``power`` when the points grow faster than the size), error
        :data:`UNKNOWN_ERROR`. Both are marked ``valid=False``.

    Raises
    ------
    ValueError
        No points, mismatched lengths, or a size or value that is not positive and
        finite.
    """
    n = np.asarray(sizes, dtype=float)
    y = np.asarray(values, dtype=float)
    if n.shape != y.shape or n.ndim != 1 or len(n) == 0:
        raise ValueError(f"need equally many sizes and values (got {n.shape} and {y.shape}), at least one")
    if not (np.all(np.isfinite(n)) and np.all(n > 0) and np.all(np.isfinite(y))):
        raise ValueError("sizes must be positive and values finite to fit a size model")
    y = np.maximum(y, 1e-12)  # a zero (e.g. no bytes) would make relative error undefined
    rng = dict(n_min=float(n.min()), n_max=float(n.max()), n_points=len(n))
    if len(np.unique(n)) == 1:
        # one size: part fixed cost, part proportional; exact at that size only
        y0 = float(np.median(y))
        return SizeFit(form="linear", a=(1.0 - ONE_POINT_FIXED_SHARE) * y0 / n[0], c=ONE_POINT_FIXED_SHARE * y0,
                       loo_error=ONE_POINT_ERROR, valid=False, **rng)
    usable = [f for f in forms if len(n) >= N_PARAMS[f] + 2]
    if not usable:
        return _two_sizes(n, y, forms, rng)
    cands = {f: _loo_error(f, n, y) for f in usable}
    fwd = {f: _forward_error(f, n, y) for f in usable}
    # a form that fails to extrapolate within its own range is not trusted beyond it
    sane = [f for f in usable if fwd[f] is None or fwd[f] <= max(2.0 * cands[f], FORWARD_SLACK)]
    usable = sane or usable
    # prefer fewer parameters unless the richer form is clearly (5%) better; a curve
    # must beat the straight line by far (LINEAR_MARGIN) to be used for extrapolation
    order = sorted(usable, key=lambda f: (N_PARAMS[f], forms.index(f)))
    best = order[0]
    for f in order[1:]:
        margin = LINEAR_MARGIN if best == "linear" else 0.95
        if cands[f] < cands[best] * margin:
            best = f
    a, b, c = _fit_form(best, n, y)
    bar = max(PLAUSIBLE_FACTOR * cands[best], PLAUSIBLE_FLOOR)
    alts = {f: list(_fit_form(f, n, y)) for f in usable if f != best and cands[f] < bar}
    return SizeFit(form=best, a=a, b=b, c=c, loo_error=cands[best], candidates=cands, alternatives=alts, **rng)
