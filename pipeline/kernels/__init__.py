"""Kernel library (numpy only): objects with ``__call__``, ``diag``, params and specs."""

from pipeline.kernels.base import Kernel, kernel_from_spec, registered_names
from pipeline.kernels.basic import RBF, Constant, Laplacian, Linear, Polynomial
from pipeline.kernels.compose import (
    Exp,
    FunctionScaled,
    Normalized,
    Product,
    Scaled,
    Sum,
    Warped,
)
from pipeline.kernels.extra import AdditiveChi2, Chi2, Cosine, Sigmoid
from pipeline.kernels.factory import SKLEARN_KERNELS, make_kernel
from pipeline.kernels.mercer import MercerReport, check_mercer
from pipeline.kernels.warping import (
    Chain,
    Coordinate,
    ElementwiseScale,
    GaussianEnvelope,
    InverseRowNorm,
    L2Normalize,
    LinearMap,
    RowNorm,
    SelectFeatures,
    Standardize,
    Warping,
    registered_warpings,
    warping_from_spec,
)

__all__ = [
    "RBF",
    "SKLEARN_KERNELS",
    "AdditiveChi2",
    "Chain",
    "Chi2",
    "Constant",
    "Coordinate",
    "Cosine",
    "ElementwiseScale",
    "Exp",
    "FunctionScaled",
    "GaussianEnvelope",
    "InverseRowNorm",
    "Kernel",
    "L2Normalize",
    "Laplacian",
    "Linear",
    "LinearMap",
    "MercerReport",
    "Normalized",
    "Polynomial",
    "Product",
    "RowNorm",
    "Scaled",
    "SelectFeatures",
    "Sigmoid",
    "Standardize",
    "Sum",
    "Warped",
    "Warping",
    "check_mercer",
    "kernel_from_spec",
    "make_kernel",
    "registered_names",
    "registered_warpings",
    "warping_from_spec",
]
