"""Input checks shared by the estimators (in-memory now, out-of-core later).

Every check runs before any kernel evaluation or factorisation, so bad input
fails fast with a ``ValueError``/``TypeError`` that names the offending value
and says how to fix it. Array conversion is delegated to scikit-learn's
``check_array``/``validate_data`` so the estimators accept exactly what
scikit-learn accepts (lists, pandas, CSR/CSC sparse matrices, feature names)
and raise the messages scikit-learn's own estimator checks look for.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

if TYPE_CHECKING:
    from pipeline.options import Knob

#: sparse formats accepted wherever X is accepted
SPARSE_FORMATS = ("csr", "csc")
#: X dtypes kept as is; anything else numeric is converted to float64
FLOAT_DTYPES = (np.float64, np.float32)


def _finite_or_raise(values: np.ndarray, what: str) -> None:
    if not np.all(np.isfinite(values)):
        n_nan = int(np.isnan(values).sum())
        n_inf = int(np.isinf(values).sum())
        raise ValueError(
            f"Input {what} contains NaN or infinity ({n_nan} NaN, {n_inf} inf values); "
            f"remove or impute them (e.g. sklearn.impute.SimpleImputer) before fitting"
        )


def validate_X_y(
    estimator: Any,
    X: Any,
    y: Any,
    *,
    precomputed: bool = False,
) -> tuple[np.ndarray | sp.spmatrix, np.ndarray]:
    """Validate training data for a kernel estimator and set ``n_features_in_``.

    Parameters
    ----------
    estimator : estimator
        Receives ``n_features_in_`` (and ``feature_names_in_`` for pandas input).
    X : array-like or sparse matrix of shape (n_samples, n_features)
        Training data, or the (n_samples, n_samples) kernel matrix when
        ``precomputed``. CSR/CSC sparse matrices are kept sparse.
    y : array-like of shape (n_samples,) or (n_samples, n_targets)
        Numeric targets.
    precomputed : bool
        X is a kernel matrix and must be square.

    Returns
    -------
    X, y : validated arrays (X float32/float64 or sparse; y float64).

    Raises
    ------
    ValueError
        NaN/inf in X or y, 1-D X, zero rows or columns, X/y length mismatch,
        a non-square precomputed kernel.
    """
    if y is None:
        raise ValueError(
            f"{type(estimator).__name__} requires y to be passed, but the target y is None; "
            "call fit(X, y) with the training targets"
        )
    # scikit-learn at call time: a Dask worker that runs tile tasks from modules which
    # import this one never pays its 0.7 s import
    from sklearn.utils.validation import validate_data

    X, y = validate_data(
        estimator,
        X,
        y,
        accept_sparse=SPARSE_FORMATS,
        dtype=FLOAT_DTYPES,
        multi_output=True,
        y_numeric=True,
    )
    if y.dtype != np.float64:
        y = y.astype(np.float64)
    if precomputed and X.shape[0] != X.shape[1]:
        raise ValueError(
            f"kernel='precomputed' expects the square training kernel matrix K(X, X) of shape "
            f"(n_samples, n_samples), got shape {X.shape}; pass K(X_train, X_train)"
        )
    return X, y


def validate_X_predict(estimator: Any, X: Any, *, precomputed: bool = False) -> Any:
    """Validate prediction input: same checks as at fit, plus the feature count.

    For ``precomputed`` kernels X is K(X_test, X_train) and must have
    ``n_samples_fit`` columns.
    """
    from sklearn.utils.validation import validate_data

    X = validate_data(estimator, X, accept_sparse=SPARSE_FORMATS, dtype=FLOAT_DTYPES, reset=False)
    return X


def check_alpha(alpha: Any, n_targets: int) -> np.ndarray:
    """Return the ridge penalty as a float64 array of length 1 or ``n_targets``.

    ``alpha`` may be a non-negative float or one value per target. ``alpha = 0``
    is allowed (the in-memory path then follows scikit-learn: Cholesky, or a
    least-squares solution with a warning when K is singular).
    """
    if isinstance(alpha, bool) or isinstance(alpha, str):
        raise TypeError(f"alpha must be a non-negative float or an array of them, got {alpha!r}")
    if isinstance(alpha, Real | Integral | np.number):
        arr = np.array([float(alpha)])
    else:
        try:
            arr = np.asarray(alpha, dtype=np.float64).ravel()
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"alpha must be a non-negative float or an array of them, got {alpha!r}"
            ) from exc
        if arr.size == 0:
            raise ValueError("alpha is empty; pass a non-negative float such as alpha=1.0")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"alpha must be finite, got {alpha!r}; pass a non-negative float")
    if np.any(arr < 0):
        raise ValueError(
            f"alpha must be >= 0, got {alpha!r}; the ridge penalty cannot be negative "
            "(use a small positive value such as 1e-6 for almost no regularisation)"
        )
    if arr.size not in (1, n_targets):
        raise ValueError(
            f"alpha has {arr.size} values but y has {n_targets} targets; pass one alpha "
            f"or one per target (shape ({n_targets},))"
        )
    return arr


def check_sample_weight(sample_weight: Any, n_samples: int) -> np.ndarray | None:
    """Return per-sample weights as float64 (None stays None).

    A scalar is broadcast. Weights must be finite and non-negative, and not all
    zero (K scaled by sqrt(w) would be the zero matrix).
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, Real | np.number) and not isinstance(sample_weight, bool):
        sw = np.full(n_samples, float(sample_weight))
    else:
        sw = np.asarray(sample_weight, dtype=np.float64)
        if sw.ndim != 1:
            raise ValueError(
                f"sample_weight must be 1-D of shape ({n_samples},), got shape {sw.shape}"
            )
        if sw.shape[0] != n_samples:
            raise ValueError(
                f"sample_weight has {sw.shape[0]} values but X has {n_samples} samples; "
                "pass one weight per row of X"
            )
    _finite_or_raise(sw, "sample_weight")
    if np.any(sw < 0):
        raise ValueError(
            f"sample_weight must be non-negative, got min {float(sw.min())!r} "
            f"(row {int(np.argmin(sw))}); "
            "drop the rows instead of giving them negative weight"
        )
    if n_samples > 0 and not np.any(sw > 0):
        raise ValueError(
            "sample_weight is zero for every sample, so there is nothing to fit; "
            "give at least one sample a positive weight"
        )
    return sw


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """Check a string option; the error lists the valid values."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {list(choices)}")
    return value


def check_positive_int(name: str, value: Any, *, allow_none: bool = True) -> int | None:
    """Check an optional positive integer parameter (block_size, max_iter, rank)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value <= 0:
        what = "a positive integer or None" if allow_none else "a positive integer"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_option(name: str, value: Any, knob: Knob) -> None:
    """Check an estimator's parameter against its knob of the option tree
    (:class:`pipeline.options.Knob`): one of its allowed values, an integer >= 1 (None
    too when the estimators spell its default None), a float inside its open bounds, or
    True/False; None where the knob is unset by default or None turns it off
    (:attr:`~pipeline.options.Knob.off`). The error names the value and what is valid."""
    if value is None and (knob.unset or knob.off):
        return
    if knob.choices is not None:
        check_choice(name, value, knob.choices)
    elif knob.type is bool:
        if not isinstance(value, bool | np.bool_):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    elif knob.type is int and knob.ge == 1:
        check_positive_int(name, value, allow_none=knob.unset)
    elif knob.type is float and knob.gt is not None and knob.lt is not None:
        if isinstance(value, bool) or not isinstance(value, Real) or not knob.gt < value < knob.lt:
            raise ValueError(
                f"{name} must be a float in ({knob.gt:g}, {knob.lt:g}), e.g. {knob.example}, "
                f"got {value!r}"
            )
    else:  # a knob whose kind this check does not know: add it here
        raise TypeError(f"no estimator check for the option {name!r} ({knob})")


def check_random_seed(random_state: Any) -> int | None:
    """The seed of ``random_state``: an int (NumPy integers too), one drawn from a
    ``RandomState`` (as scikit-learn estimators draw theirs; it advances it), or None."""
    if random_state is None:
        return None
    if isinstance(random_state, Integral) and not isinstance(random_state, bool):
        return int(random_state)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(np.iinfo(np.int32).max))
    raise ValueError(f"random_state must be an int, a RandomState or None, got {random_state!r}")
