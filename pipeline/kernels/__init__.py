"""Kernel library (numpy only): objects with ``__call__``, ``diag``, params and specs."""

from pipeline.kernels.base import Kernel, kernel_from_spec, registered_names
from pipeline.kernels.basic import RBF, Constant, Laplacian, Linear, Polynomial
from pipeline.kernels.factory import make_kernel

__all__ = [
    "RBF",
    "Constant",
    "Kernel",
    "Laplacian",
    "Linear",
    "Polynomial",
    "kernel_from_spec",
    "make_kernel",
    "registered_names",
]
