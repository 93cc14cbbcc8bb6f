"""Model selection at scale: cross-validation over λ and kernel parameters that
shares the expensive work (one Gram / eigendecomposition per kernel setting,
exact LOO and leave-group-out residuals from one factorisation per λ, warm
started CG with a shared preconditioner)."""

from pipeline.models.selection.loo import inverse_diagonal, lgo_residuals, loo_residuals
from pipeline.models.selection.plots import plot_cv_results, plot_heatmap, plot_score_vs_alpha
from pipeline.models.selection.report import save_search_report, search_from_config
from pipeline.models.selection.search import KernelRidgeCV

__all__ = [
    "KernelRidgeCV",
    "inverse_diagonal",
    "lgo_residuals",
    "loo_residuals",
    "plot_cv_results",
    "plot_heatmap",
    "plot_score_vs_alpha",
    "save_search_report",
    "search_from_config",
]
