"""What every kernel estimator here shares: scikit-learn's kernel parameters, resolved once."""

from __future__ import annotations

from pipeline.kernels import Kernel
from pipeline.kernels.factory import resolve_estimator_kernel


class KernelParamsMixin:
    """``kernel``, ``gamma``, ``degree``, ``coef0``, ``kernel_params`` as scikit-learn has them.

    Gives sparse-input and pairwise (``kernel="precomputed"``) tags, and resolves
    the parameters to a :class:`~pipeline.kernels.Kernel` (None for callables and
    ``"precomputed"``, which are evaluated through scikit-learn).
    """

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.pairwise = self._precomputed
        return tags

    @property
    def _precomputed(self) -> bool:
        return isinstance(self.kernel, str) and self.kernel == "precomputed"

    def _resolve_kernel(self) -> Kernel | None:
        """The Kernel object for names/specs/Kernels; None for callables and precomputed."""
        return resolve_estimator_kernel(
            self.kernel,
            gamma=self.gamma,
            degree=self.degree,
            coef0=self.coef0,
            kernel_params=self.kernel_params,
        )
