"""``pipeline.KernelPerceptron``: the mistake-driven dual perceptron with theta0 (seed 002).

With labels y in {-1, +1} and mistake counts a_i, the discriminant is

    f(x) = sum_i a_i y_i K(x_i, x) + theta0,   theta0 = sum_i a_i y_i,

(the lecture's ``sum_i a_i y_i [K(x_i, x) + 1]``). Cycling through the
training points, a mistake ``y_t f(x_t) <= 0`` increments ``a_t``. Training
stops after an epoch without mistakes (converged) or after ``max_epochs``.
More than two classes are handled one-vs-rest, one dual vector per class.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics.pairwise import pairwise_kernels
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from pipeline.engine.dense import kernel_matrix
from pipeline.linalg.dense_memory import check_dense_memory, dense_dual_bytes
from pipeline.linalg.predict_model import predict_in_memory
from pipeline.models.artifact import Model
from pipeline.models.kernel_estimator import KernelParamsMixin
from pipeline.models.model_io import perceptron_model
from pipeline.validation import FLOAT_DTYPES, SPARSE_FORMATS, check_positive_int


def _dense(X: Any) -> np.ndarray:
    return X.toarray() if sp.issparse(X) else X


def _train_binary(
    K: np.ndarray, y: np.ndarray, max_epochs: int, order_rng: Any, fit_intercept: bool
) -> tuple[np.ndarray, int, bool]:
    """Mistake counts for labels y in {-1, +1} on the Gram matrix K (+1 if fit_intercept)."""
    n = y.shape[0]
    counts = np.zeros(n, dtype=np.int64)
    f = np.zeros(n)  # current discriminant at every training point
    bias = 1.0 if fit_intercept else 0.0
    for epoch in range(1, max_epochs + 1):
        mistakes = 0
        order = np.arange(n) if order_rng is None else order_rng.permutation(n)
        for t in order:
            if y[t] * f[t] <= 0:
                counts[t] += 1
                f += y[t] * (K[t] + bias)
                mistakes += 1
        if mistakes == 0:
            return counts, epoch, True
    return counts, max_epochs, False


class KernelPerceptron(KernelParamsMixin, ClassifierMixin, BaseEstimator):
    """Kernel perceptron (dual, mistake-driven) with the offset theta0.

    Parameters
    ----------
    kernel : str, Kernel, dict or callable, default="rbf"
        As in :class:`pipeline.KernelRidge` (``"precomputed"`` included).
    gamma, degree, coef0 : as in scikit-learn, forwarded to named kernels.
    kernel_params : dict, default=None
        Arguments of a callable kernel, or ``set_params`` values for a Kernel.
    max_epochs : int, default=100
        Passes over the data at most; a warning is raised if the last pass still
        made mistakes (the data are not separable in feature space, or need more passes).
    fit_intercept : bool, default=True
        Learn theta0 (the lecture's ``K + 1``); False gives a perceptron through the origin.
    shuffle : bool, default=False
        Visit the points in a new random order each epoch (else in data order).
    random_state : int, RandomState or None, default=None
        Seed of the shuffling.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    mistakes_ : ndarray of shape (n_samples,) or (n_samples, n_classes)
        The mistake counts a_i (per one-vs-rest problem for > 2 classes).
    dual_coef_ : ndarray, same shape as ``mistakes_``
        a_i y_i, so that ``decision_function(X) = K(X, X_fit) @ dual_coef_ + intercept_``.
    intercept_ : float or ndarray of shape (n_classes,)
        theta0 = sum_i a_i y_i (0 when ``fit_intercept=False``).
    X_fit_ : ndarray or sparse matrix
    n_iter_ : int
        Epochs run (the largest over one-vs-rest problems).
    converged_ : bool
        True if an epoch made no mistakes (for every one-vs-rest problem).
    kernel_ : Kernel or None
    """

    def __init__(
        self,
        kernel: Any = "rbf",
        *,
        gamma: float | None = None,
        degree: float = 3,
        coef0: float = 1,
        kernel_params: dict | None = None,
        max_epochs: int = 100,
        fit_intercept: bool = True,
        shuffle: bool = False,
        random_state: Any = None,
    ) -> None:
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.kernel_params = kernel_params
        self.max_epochs = max_epochs
        self.fit_intercept = fit_intercept
        self.shuffle = shuffle
        self.random_state = random_state

    def _kernel_matrix(self, X: Any, Y: Any = None) -> np.ndarray:
        if self._precomputed:
            return np.asarray(_dense(X), dtype=np.float64)
        k = self.kernel_
        if k is None:
            return pairwise_kernels(
                X, Y, metric=self.kernel, filter_params=True, **(self.kernel_params or {})
            )
        # the fused evaluators (the kernel object's code for kernels they do not know);
        # a kernel that overflows is refused (NonFiniteKernelError)
        return np.asarray(kernel_matrix(k, X, Y), dtype=np.float64)

    def fit(self, X: Any, y: Any) -> KernelPerceptron:
        """Run the kernel perceptron until an epoch without mistakes or ``max_epochs``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data (the training kernel matrix if ``kernel="precomputed"``).
        y : array-like of shape (n_samples,)
            Class labels (two or more classes).

        Returns
        -------
        self
        """
        check_positive_int("max_epochs", self.max_epochs, allow_none=False)
        kernel = self._resolve_kernel()
        if y is None:
            raise ValueError(
                "KernelPerceptron requires y to be passed, but the target y is None; "
                "call fit(X, y) with class labels"
            )
        X, y = validate_data(self, X, y, accept_sparse=SPARSE_FORMATS, dtype=FLOAT_DTYPES)
        check_classification_targets(y)
        if self._precomputed and X.shape[0] != X.shape[1]:
            raise ValueError(
                f"kernel='precomputed' expects the square training kernel matrix, got {X.shape}"
            )
        classes, y_idx = np.unique(y, return_inverse=True)
        if classes.size < 2:
            raise ValueError(
                f"KernelPerceptron needs samples of at least 2 classes in the data, but the "
                f"data contain only one class: {classes[0]!r}"
            )
        self.classes_ = classes
        self.kernel_ = kernel
        check_dense_memory(
            dense_dual_bytes(X.shape[0], X.shape[1], 1, kernel_copies=1),
            what=f"the kernel perceptron's n x n kernel with n_samples={X.shape[0]}",
        )
        K = self._kernel_matrix(X)
        rng = check_random_state(self.random_state) if self.shuffle else None
        # binary: class 1 is +1, class 0 is -1; multiclass: one-vs-rest
        targets = (
            [np.where(y_idx == 1, 1.0, -1.0)]
            if classes.size == 2
            else [np.where(y_idx == c, 1.0, -1.0) for c in range(classes.size)]
        )
        counts, epochs, conv = [], [], []
        for yt in targets:
            c, e, ok = _train_binary(K, yt, int(self.max_epochs), rng, bool(self.fit_intercept))
            counts.append(c)
            epochs.append(e)
            conv.append(ok)
        Y = np.stack(targets, axis=1)
        M = np.stack(counts, axis=1)
        dual = M * Y
        intercept = dual.sum(axis=0) if self.fit_intercept else np.zeros(len(targets))
        if classes.size == 2:
            M, dual, intercept = M[:, 0], dual[:, 0], float(intercept[0])
        self.mistakes_ = M
        self.dual_coef_ = dual
        self.intercept_ = intercept
        self.n_iter_ = max(epochs)
        self.converged_ = all(conv)
        self.X_fit_ = X
        self._model = perceptron_model(self)  # None for a kernel no model holds
        if not self.converged_:
            warnings.warn(
                f"KernelPerceptron made mistakes in the last of max_epochs={self.max_epochs} "
                "epochs; the data may not be separable under this kernel. Increase "
                "max_epochs or change the kernel.",
                ConvergenceWarning,
                stacklevel=2,
            )
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        """theta·phi(x) + theta0 = ``K(X, X_fit) @ dual_coef_ + intercept_``.

        Returns shape (n_samples,) for two classes (positive means ``classes_[1]``),
        else (n_samples, n_classes).
        """
        check_is_fitted(self, "dual_coef_")
        X = validate_data(self, X, accept_sparse=SPARSE_FORMATS, dtype=FLOAT_DTYPES, reset=False)
        if self._precomputed:
            return self._kernel_matrix(X, self.X_fit_) @ self.dual_coef_ + self.intercept_
        model = getattr(self, "_model", None)
        if model is not None:  # by the fitted model, in memory (intercept_ is its y_mean)
            return model.predict(X)
        # a callable kernel (no model holds it): kernel rows in blocks
        scores = predict_in_memory(
            X, self.X_fit_, self.dual_coef_, None,
            kernel_fn=lambda Xb: self._kernel_matrix(Xb, self.X_fit_),
        )  # fmt: skip
        return scores + self.intercept_

    @property
    def model_(self) -> Model:
        """The fitted model, the one fitted-model type :class:`pipeline.models.artifact.Model`
        (made by ``fit``): the training rows, ``dual_coef_``, the kernel and ``intercept_``
        as its output offset, so that ``model_.predict(X)`` is :meth:`decision_function`.
        It can be saved (:meth:`~pipeline.models.artifact.Model.save`); :func:`pipeline.load`
        loads KernelRidge models only, :func:`pipeline.models.artifact.load_artifact` this one.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before ``fit``.
        ValueError
            A callable or ``"precomputed"`` kernel (no kernel spec: no model).
        """
        check_is_fitted(self, "dual_coef_")
        model = getattr(self, "_model", None)
        if model is None:
            raise ValueError(
                f"a model with kernel={self.kernel!r} cannot be saved (no kernel spec)"
            )
        return model

    def predict(self, X: Any) -> np.ndarray:
        """Class labels: the sign of the decision function (argmax one-vs-rest)."""
        scores = self.decision_function(X)
        if scores.ndim == 1:
            return self.classes_[(scores > 0).astype(int)]
        return self.classes_[np.argmax(scores, axis=1)]
