"""Validation of the search space: the λ grid, kernel-parameter grids and folds.

Every check runs before any kernel evaluation, and every error names the
offending value and the fix.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np
from sklearn.model_selection import (
    BaseCrossValidator,
    KFold,
    LeaveOneOut,
    ParameterGrid,
    ShuffleSplit,
    check_cv,
)

from pipeline.kernels import Kernel
from pipeline.kernels.factory import resolve_estimator_kernel

__all__ = [
    "Candidate",
    "build_candidates",
    "check_alphas",
    "check_settings_width",
    "make_splits",
    "resolve_kernel",
]


def check_alphas(alphas: Any) -> np.ndarray:
    """The λ grid as a 1-D float array: non-empty, finite and > 0."""
    if alphas is None:
        raise ValueError("alphas=None: give a non-empty list of ridge penalties, e.g. [0.1, 1, 10]")
    if isinstance(alphas, Real) and not isinstance(alphas, bool):
        alphas = [alphas]
    try:
        a = np.asarray(alphas, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise ValueError(f"alphas must be a list of positive numbers, got {alphas!r}") from None
    if a.size == 0:
        raise ValueError(
            f"alphas={alphas!r} is an empty grid; give at least one ridge penalty, "
            "e.g. alphas=np.logspace(-3, 2, 10)"
        )
    bad = a[~np.isfinite(a) | (a <= 0)]
    if bad.size:
        raise ValueError(
            f"alphas must all be finite and > 0 (kernel ridge needs a strictly positive "
            f"ridge), got {bad[0]!r} in alphas={list(a)!r}; drop it or use a small positive value"
        )
    return a


def resolve_kernel(kernel: Any, gamma: Any = None, degree: Any = 3, coef0: Any = 1) -> Kernel:
    """A :class:`~pipeline.kernels.Kernel` from a name, spec or Kernel (callables refused)."""
    if isinstance(kernel, str) and kernel == "precomputed":
        raise ValueError(
            "kernel='precomputed' is not supported by KernelRidgeCV: the search evaluates the "
            "kernel for every parameter setting; pass a kernel name or a Kernel object"
        )
    try:
        k = resolve_estimator_kernel(kernel, gamma=gamma, degree=degree, coef0=coef0)
    except TypeError:
        k = None
    if k is None:
        raise ValueError(
            f"kernel={kernel!r} is not supported by KernelRidgeCV; pass a kernel name "
            "('rbf', 'laplacian', 'polynomial', 'linear', ...), a spec dict or a Kernel object "
            "(callables: wrap pipeline.KernelRidge in sklearn's GridSearchCV instead)"
        )
    # the search sets parameters on it: never mutate the caller's object
    return copy.deepcopy(k) if k is kernel else k


class Candidate(dict):
    """One grid point: ``{"alpha": ..., **kernel_params}`` (a dict, for ``cv_results_``)."""

    @property
    def kernel_params(self) -> dict[str, Any]:
        return {k: v for k, v in self.items() if k != "alpha"}


def _grid_dicts(param_grid: Any) -> list[dict[str, Sequence[Any]]]:
    if param_grid is None:
        return [{}]
    if isinstance(param_grid, Mapping):
        grids = [param_grid]
    elif isinstance(param_grid, Sequence) and not isinstance(param_grid, str):
        grids = list(param_grid)
        if not grids:
            raise ValueError(
                "param_grid=[] is an empty grid; give a dict such as {'gamma': [0.1, 1.0]} "
                "or None to search only alphas"
            )
    else:
        raise ValueError(
            f"param_grid must be a dict of kernel parameter -> list of values, a list of such "
            f"dicts, or None; got {param_grid!r}"
        )
    out = []
    for g in grids:
        if not isinstance(g, Mapping):
            raise ValueError(f"param_grid entries must be dicts, got {g!r}")
        d = {}
        for key, values in g.items():
            if key == "alpha":
                raise ValueError(
                    "param_grid contains 'alpha'; give the ridge penalties as alphas=[...] "
                    "(they are searched at almost no extra cost)"
                )
            if isinstance(values, str) or not isinstance(values, Sequence | np.ndarray):
                raise ValueError(
                    f"param_grid[{key!r}] must be a list of values, got {values!r}; "
                    f"e.g. {{{key!r}: [{values!r}]}}"
                )
            if len(values) == 0:
                raise ValueError(f"param_grid[{key!r}] is an empty list; give at least one value")
            # numpy values as plain lists and numbers: an ARD length-scale vector then
            # compares (candidates, settings) and serialises like any other value
            d[key] = [_plain(v) for v in values]
        out.append(d)
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def check_settings_width(
    base_kernel: Kernel, settings: list[dict[str, Any]], n_features: int
) -> None:
    """Every kernel setting of the grid fits data with ``n_features`` columns (an ARD
    length-scale vector has one entry per feature): checked before any kernel evaluation."""
    for setting in settings or [{}]:
        kernel = copy.deepcopy(base_kernel).set_params(**setting) if setting else base_kernel
        try:
            kernel.check_n_features(n_features)
        except ValueError as exc:
            where = f" (param_grid setting {setting!r})" if setting else ""
            raise ValueError(f"{exc}{where}") from None


def build_candidates(
    alphas: np.ndarray, param_grid: Any, base_kernel: Kernel
) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """All grid points in scikit-learn's ``ParameterGrid`` order, and the kernel settings.

    The candidates are ordered exactly as ``GridSearchCV(param_grid={"alpha":
    alphas, **param_grid})`` orders them, so ties are broken the same way.

    Returns
    -------
    candidates : list of Candidate
    settings : list of dict
        The distinct kernel-parameter settings, in order of first appearance.
    """
    valid = set(base_kernel.get_params(deep=True))
    grids = _grid_dicts(param_grid)
    for g in grids:
        for key, values in g.items():
            if key not in valid:
                raise ValueError(
                    f"param_grid has {key!r} but kernel {base_kernel!r} has no parameter "
                    f"{key!r}; its parameters are {sorted(valid) or 'none'}"
                )
            for v in values:  # fail before any kernel evaluation
                try:
                    copy.deepcopy(base_kernel).set_params(**{key: v})
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"param_grid[{key!r}] value {v!r} is invalid: {exc}") from None
    alpha_list = [float(a) for a in alphas]
    candidates: list[Candidate] = []
    for g in grids:
        for p in ParameterGrid({"alpha": alpha_list, **g}):
            candidates.append(Candidate(p))
    settings: list[dict[str, Any]] = []
    for c in candidates:
        kp = c.kernel_params
        if kp not in settings:
            settings.append(kp)
    return candidates, settings


def make_splits(
    cv: Any, X: Any, y: np.ndarray, random_state: Any = None, groups: Any = None
) -> tuple[list[tuple[np.ndarray, np.ndarray]], str]:
    """The (train, test) index pairs of ``cv``, and their kind.

    ``cv`` is an int (K-fold, as scikit-learn's ``check_cv`` for a regressor),
    ``"loo"`` or a ``LeaveOneOut`` (exact leave-one-out), a float in (0, 1)
    (one shuffled held-out split of that fraction), any scikit-learn splitter
    or an iterable of (train, test) index arrays. ``groups`` goes to the
    splitter's ``split`` (``GroupKFold``, ``LeaveOneGroupOut``...).

    Returns
    -------
    splits : list of (train_idx, test_idx)
    kind : {"loo", "complement", "splits"}
        ``"complement"`` when every training set is exactly the rows outside its
        test set (K-fold, held-out splits): the leave-group-out formulas apply.
    """
    n = int(y.shape[0])
    if isinstance(cv, str):
        if cv.lower() not in ("loo", "leave-one-out"):
            raise ValueError(
                f"cv={cv!r} is not understood; use an int (folds), 'loo', a float test "
                "fraction, or a scikit-learn splitter"
            )
        cv = LeaveOneOut()
    if isinstance(cv, LeaveOneOut):
        if n < 2:
            raise ValueError(f"leave-one-out needs at least 2 rows, got {n}")
        idx = np.arange(n)
        return [(np.delete(idx, i), idx[i : i + 1]) for i in range(n)], "loo"
    if cv is None:
        cv = 5
    if isinstance(cv, Integral) and not isinstance(cv, bool):
        if cv < 2:
            raise ValueError(f"cv={cv} folds: K-fold needs cv >= 2 (or 'loo', or a splitter)")
        if cv > n:
            raise ValueError(
                f"cv={cv} folds is more than the {n} rows; use cv <= {n} (cv='loo' for "
                "one row per fold)"
            )
        cv = KFold(n_splits=int(cv))
    elif isinstance(cv, Real) and not isinstance(cv, bool):
        if not 0 < cv < 1:
            raise ValueError(f"a float cv is a held-out fraction in (0, 1), got cv={cv!r}")
        cv = ShuffleSplit(n_splits=1, test_size=float(cv), random_state=random_state)
    else:
        n_splits = getattr(cv, "n_splits", None)
        if isinstance(cv, BaseCrossValidator | KFold) and isinstance(n_splits, Integral):
            if n_splits > n:
                raise ValueError(
                    f"the splitter {cv!r} asks for {n_splits} folds but there are only {n} rows"
                )
        cv = check_cv(cv, y, classifier=False)
    splits = [
        (np.asarray(tr, dtype=np.int64), np.asarray(te, dtype=np.int64))
        for tr, te in cv.split(X, y, groups)  # groups: GroupKFold and its kin
    ]
    if not splits:
        raise ValueError(f"cv={cv!r} produced no (train, test) splits")
    for tr, te in splits:
        if tr.size == 0 or te.size == 0:
            raise ValueError(f"cv={cv!r} produced a split with an empty train or test set")
    complement = True
    for tr, te in splits:
        # every row exactly once, in train or test (a repeated training row beside a
        # missing one has the right sizes: the fold formulas then trained on that row)
        u = np.unique(tr)
        if u.size != tr.size or u.size + te.size != n or np.union1d(u, te).size != n:
            complement = False
    kind = "complement" if complement else "splits"
    return splits, kind
