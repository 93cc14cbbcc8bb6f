"""The package's import graph: no import cycle, and imports only go down the layers.

Every import of one of the package's own modules counts, wherever it stands: at module
level, inside a function (a lazy import), under ``if TYPE_CHECKING:``. Relative imports
are resolved; ``import pipeline.x`` of a package counts as importing
``pipeline/x/__init__.py``, and ``from pipeline.x import name`` counts as importing the
submodule ``pipeline.x.name`` when there is one, else ``pipeline.x``. (Importing a
submodule also runs its packages' ``__init__``; that is not counted as an edge, or every
module would import ``pipeline``.) Names loaded through ``importlib.import_module`` or
looked up in ``sys.modules`` are not edges: :func:`hidden_imports` finds those, and
they are refused (but for the package root's public names, :data:`IMPORTLIB_ALLOWED`).

Every import of the package's own modules stands at module level (issue #43), the command
line and the report included: a lazy import is kept only for third-party and optional
dependencies. Where a module-level import would close a cycle, the shared name moves down
to its layer; a name a test replaces is looked up on its module (``parallel.compute``),
or the test replaces it where it is used.

History (issue #43): an earlier version of this test (issue #16) read module-level
imports only, while the package made 251 function-level imports of its own modules;
splitting files by size had made 11 import cycles that only function-level imports
closed (cholesky <-> cholesky_inplace, precond <-> precond_adaptive, triangular <->
refine, lock <-> lease, runner <-> results <-> recovery, cli_args <-> cli_errors,
progress <-> progress_dask, kernels.base <-> basic/compose/warping, ...). Then 74
function-level imports outside the command line and the report remained (79 inside them),
the stage modules were loaded by name through ``importlib``, and ``kernels.base`` and
``kernels.warping`` found each other in ``sys.modules``; none is left.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "pipeline"

#: the layers, bottom first: a module may import modules of its own layer or of a layer
#: below, never above. An entry names a module, or a package and every module under it;
#: the longest entry that covers a module decides its layer (``pipeline`` itself, the
#: package's face, covers only itself).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base: errors, options, constants, helpers",
        (
            "pipeline._version",
            "pipeline._optional",
            # the OpenBLAS environment, set before NumPy or SciPy load
            "pipeline._blas_env",
            "pipeline.errors",
            "pipeline.options",
            # exact power-of-two scaling of data far from 1 (issue #44)
            "pipeline.float_range",
            # NumPy's products of a matrix with its transpose, past OpenBLAS's SYRK crash
            "pipeline.blas_guard",
            "pipeline.validation",
            "pipeline.diagnostics",
            # the tuning constants every layer reads (block sizes, budgets, thresholds)
            "pipeline.constants",
        ),
    ),
    (
        "kernels and storage (inputs as row blocks included)",
        ("pipeline.kernels", "pipeline.storage"),
    ),
    ("engine: tiles, executors, placement, BLAS width, progress", ("pipeline.engine",)),
    ("linalg: Gram, Cholesky, triangular, PCG, Nystrom, dense, predict", ("pipeline.linalg",)),
    ("plan: cost models, FitPlan, CV routing", ("pipeline.plan",)),
    ("fit", ("pipeline.fit",)),
    ("models: estimators, model selection, artifacts", ("pipeline.models",)),
    ("run: config and stages", ("pipeline.stages",)),
    (
        "front: command line, report, the package's face",
        ("pipeline.cli", "pipeline.report", "pipeline"),
    ),
]

#: the modules that may still import the package's own modules inside a function: none
#: (the command line and the report were the last, issue #43). An entry covers a module
#: and every module under it.
LAZY_ALLOWED: tuple[str, ...] = ()

#: the modules that may call ``importlib.import_module``: the package root (PEP 562 public
#: names: ``import pipeline`` loads no estimator, nor NumPy and Dask) and
#: ``pipeline._optional`` (it imports the optional third-party packages, the keys of its
#: ``EXTRAS``), besides :data:`LAZY_ALLOWED`
IMPORTLIB_ALLOWED: tuple[str, ...] = ("pipeline", "pipeline._optional")

#: layer-map entries that may be absent from this tree (made on another branch)
MAY_BE_ABSENT: set[str] = set()

#: the upward imports the code still makes, each to be removed by moving the importer
#: or the imported name to its layer. The list is exact: a new upward import fails the
#: test, and so does an entry that no longer occurs (remove it), so it can only shrink.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}
#: (emptied in issue #43: the reference's one-call fit moved to ``pipeline.fit``, its
#: dense-or-primal choice to ``pipeline.plan.fit_plan``, and ``solvers/choose.py``'s
#: wrappers of the plan's rules were deleted)


# -- the analysis ---------------------------------------------------------------------------


def package_modules(root: Path = ROOT, package: str = PKG) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of ``package`` under ``root``."""
    out = {}
    for p in (root / package).rglob("*.py"):
        parts = p.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def imports(root: Path = ROOT, package: str = PKG) -> tuple[tuple[str, str, int, str], ...]:
    """Every import of a module of ``package`` by another: ``(importer, imported, line,
    where)``, ``where`` one of ``"module"``, ``"function"``, ``"type-checking"``."""
    mods = package_modules(root, package)
    out: list[tuple[str, str, int, str]] = []
    for m, path in mods.items():
        here = m if path.name == "__init__.py" else m.rpartition(".")[0]

        def visit(node: ast.AST, where: str, m: str = m, here: str = here) -> None:
            for child in ast.iter_child_nodes(node):
                w = where
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    w = "function"
                elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    for stmt in child.body:
                        visit(ast.Module(body=[stmt], type_ignores=[]), "type-checking")
                    for stmt in child.orelse:
                        visit(ast.Module(body=[stmt], type_ignores=[]), where)
                    continue
                targets: list[str] = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        parts = here.split(".")[: len(here.split(".")) - (child.level - 1)]
                        base = ".".join(parts + ([base] if base else []))
                    targets = [
                        f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                        for a in child.names
                    ]
                for t in targets:
                    if t == package or t.startswith(package + "."):
                        owner = _owner(t, mods)
                        if owner and owner != m:
                            out.append((m, owner, child.lineno, w))
                visit(child, w)

        visit(ast.parse(path.read_text(encoding="utf-8")), "module")
    return tuple(out)


def hidden_imports(root: Path = ROOT, package: str = PKG) -> tuple[tuple[str, int, str], ...]:
    """The imports no import statement shows: ``(module, line, code)`` for every call of
    ``importlib.import_module`` or ``__import__`` (whatever it names: a name built at run
    time is not seen otherwise), and every look-up of one of the package's modules in
    ``sys.modules`` by name (``sys.modules["pipeline.x"]``, ``sys.modules.get(...)``)."""

    def names_ours(key: ast.AST | None) -> bool:
        return (
            isinstance(key, ast.Constant)
            and isinstance(key.value, str)
            and (key.value == package or key.value.startswith(package + "."))
        )

    out = []
    for m, path in package_modules(root, package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            hit = False
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                hit = name in ("import_module", "__import__")
                if isinstance(f, ast.Attribute) and ast.unparse(f.value) == "sys.modules":
                    hit = hit or names_ours(node.args[0] if node.args else None)
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
                hit = names_ours(node.slice)
            if hit:
                out.append((m, node.lineno, ast.unparse(node)))
    return tuple(sorted(out))


def covered(module: str, entries: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``entries`` or under one of them."""
    return any(module == e or module.startswith(e + ".") for e in entries)


def lazy_imports(
    root: Path = ROOT,
    package: str = PKG,
    lazy_allowed: tuple[str, ...] = LAZY_ALLOWED,
    importlib_allowed: tuple[str, ...] = IMPORTLIB_ALLOWED,
) -> list[str]:
    """The package's imports of its own modules that are not at module level, outside
    the modules allowed them: function-level imports, ``importlib`` and ``sys.modules``."""
    found = [
        f"{src}: imports {dst} in a function (line {line})"
        for src, dst, line, where in imports(root, package)
        if where == "function" and not covered(src, lazy_allowed)
    ]
    found += [
        f"{m}: {code} (line {line})"
        for m, line, code in hidden_imports(root, package)
        if not covered(m, lazy_allowed) and m not in importlib_allowed
    ]
    return sorted(found)


def import_graph(
    root: Path = ROOT,
    package: str = PKG,
    where: tuple[str, ...] = ("module", "function", "type-checking"),
) -> dict[str, set[str]]:
    """Module -> the package modules it imports (by default: every import, anywhere)."""
    graph: dict[str, set[str]] = {m: set() for m in package_modules(root, package)}
    for src, dst, _, w in imports(root, package):
        if w in where:
            graph[src].add(dst)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def layer_of(
    layers: list[tuple[str, tuple[str, ...]]], package: str = PKG
) -> Callable[[str], int | None]:
    """``module -> index of its layer`` (None: no entry covers it)."""
    entries = {e: i for i, (_, names) in enumerate(layers) for e in names}

    def find(module: str) -> int | None:
        name = module
        while name:
            if name in entries and (name != package or module == package):
                return entries[name]
            name = name.rpartition(".")[0]
        return None

    return find


def upward_imports(
    graph: dict[str, set[str]], layer: Callable[[str], int | None]
) -> set[tuple[str, str]]:
    """``(importer, imported)`` where the imported module's layer is above the importer's."""
    return {
        (src, dst)
        for src, dsts in graph.items()
        for dst in dsts
        if layer(src) is not None and layer(dst) is not None and layer(dst) > layer(src)  # type: ignore[operator]
    }


def _why(graph_edges: tuple[tuple[str, str, int, str], ...], comp: list[str]) -> str:
    lines = {
        f"  {s} -> {d} (line {n}, {w})" for s, d, n, w in graph_edges if s in comp and d in comp
    }
    return "\n".join(sorted(lines))


# -- the analysis finds what it must (a test that cannot fail is a defect) ------------------


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_the_cycle_finder_finds_a_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_every_kind_of_import(tmp_path):
    root = _plant(
        tmp_path,
        {
            "pk/__init__.py": "",
            "pk/low.py": "X = 1\n",
            "pk/sub/__init__.py": "from . import leaf\n",
            "pk/sub/leaf.py": "from ..low import X\n",
            "pk/sub/other.py": "def f():\n    from pk.sub import leaf, name\n",
            "pk/top.py": (
                "from typing import TYPE_CHECKING\nimport numpy\n"
                "if TYPE_CHECKING:\n    from pk.sub.other import f\n"
                "class C:\n    def m(self):\n        import pk.sub\n"
                "g = lambda: __import__('pk.low')\n"
            ),
        },
    )
    found = {(s, d, w) for s, d, _, w in imports(root, "pk")}
    assert found == {
        ("pk.sub", "pk.sub.leaf", "module"),  # relative, a submodule by name
        ("pk.sub.leaf", "pk.low", "module"),  # relative, two levels
        ("pk.sub.other", "pk.sub.leaf", "function"),  # a submodule named in a from-import
        ("pk.sub.other", "pk.sub", "function"),  # a name of the package: its __init__
        ("pk.top", "pk.sub.other", "type-checking"),
        ("pk.top", "pk.sub", "function"),  # in a method: a package counts as its __init__
    }
    assert import_graph(root, "pk")["pk.top"] == {"pk.sub", "pk.sub.other"}
    assert import_graph(root, "pk", where=("module",))["pk.top"] == set()


def test_a_cycle_closed_by_a_function_level_import_is_found(tmp_path):
    root = _plant(
        tmp_path,
        {
            "pk/__init__.py": "",
            "pk/a.py": "from pk.b import y\nx = 1\n",
            "pk/b.py": "y = 2\ndef f():\n    from pk.a import x\n    return x\n",
        },
    )
    assert cycles(import_graph(root, "pk", where=("module",))) == []
    assert cycles(import_graph(root, "pk")) == [["pk.a", "pk.b"]]


def test_the_lazy_import_check_finds_each_kind(tmp_path):
    root = _plant(
        tmp_path,
        {
            "pk/__init__.py": (
                "import importlib\n"
                "def __getattr__(n):\n    return importlib.import_module('pk.b')\n"
            ),
            "pk/b.py": "import importlib, sys\nx = importlib.import_module('json')\n",
            "pk/a.py": (
                "import sys\nimport pk.b\n"
                "def f():\n"
                "    from pk import b\n"
                "    from pk.front import c\n"
                "    import numpy\n"
                "    return sys.modules['pk.b'], sys.modules.get('pk.front')\n"
                "def g():\n"
                "    return __import__('pk.b'), sys.modules['numpy'], 'pk.b' in sys.modules\n"
            ),
            "pk/front/__init__.py": "",
            "pk/front/c.py": (
                "import importlib\ndef f():\n    from pk import a\n"
                "    return importlib.import_module('pk.b')\n"
            ),
        },
    )
    assert {(m, code) for m, _, code in hidden_imports(root, "pk")} == {
        ("pk", "importlib.import_module('pk.b')"),
        ("pk.b", "importlib.import_module('json')"),
        ("pk.a", "sys.modules['pk.b']"),
        ("pk.a", "sys.modules.get('pk.front')"),
        ("pk.a", "__import__('pk.b')"),
        ("pk.front.c", "importlib.import_module('pk.b')"),
    }
    found = lazy_imports(root, "pk", lazy_allowed=("pk.front",), importlib_allowed=("pk",))
    assert found == [
        "pk.a: __import__('pk.b') (line 9)",
        "pk.a: imports pk.b in a function (line 4)",
        "pk.a: imports pk.front.c in a function (line 5)",
        "pk.a: sys.modules.get('pk.front') (line 7)",
        "pk.a: sys.modules['pk.b'] (line 7)",
        "pk.b: importlib.import_module('json') (line 2)",
    ]
    assert covered("pk.front", ("pk.front",)) and not covered("pk.frontier", ("pk.front",))


def test_the_layer_check_finds_an_upward_import():
    layers = [("low", ("p.low",)), ("high", ("p.high", "p"))]
    find = layer_of(layers, "p")
    assert (find("p.low"), find("p.high.x"), find("p"), find("p.other")) == (0, 1, 1, None)
    g = {"p.low": {"p.high.x"}, "p.high.x": {"p.low"}, "p": {"p.low"}}
    assert upward_imports(g, find) == {("p.low", "p.high.x")}


def test_the_graph_sees_real_imports():
    g = import_graph()
    assert "pipeline.storage" in g["pipeline.linalg.cholesky"]  # module level
    assert "pipeline.stages.config" in g["pipeline.cli.errors"]  # (function level until #43)


# -- the package --------------------------------------------------------------------------


def test_no_import_cycle_counting_function_level_imports():
    found = cycles(import_graph())
    edges = imports()
    assert found == [], (
        "import cycles (break them: move the shared name down, merge, or pass a callable):\n"
        + "\n".join(f"{c}:\n{_why(edges, c)}" for c in found)
    )


def test_no_lazy_import_of_the_packages_own_modules():
    """Issue #43: every import of the package's own modules stands at module level, where
    the import graph and the layer check see it, and where an import cycle shows at once;
    lazy imports remain for third-party and optional dependencies only."""
    found = lazy_imports()
    assert found == [], (
        "lazy imports of the package's own modules (move each to module level; where that "
        "makes a cycle, move the shared name down to its layer):\n  " + "\n  ".join(found)
    )
    mods = package_modules()
    assert [e for e in LAZY_ALLOWED + IMPORTLIB_ALLOWED if e not in mods] == []


def test_the_optional_dependencies_are_third_party():
    """``pipeline._optional`` may call importlib: only for the packages of its extras."""
    from pipeline._optional import EXTRAS

    assert [m for m in EXTRAS if covered(m, (PKG,))] == []


def test_every_module_has_a_layer_and_every_entry_a_module():
    mods = package_modules()
    find = layer_of(LAYERS)
    assert sorted(m for m in mods if find(m) is None) == [], "add these modules to LAYERS"
    entries = [e for _, names in LAYERS for e in names]
    assert len(entries) == len(set(entries))
    assert sorted(e for e in entries if e not in mods and e not in MAY_BE_ABSENT) == []


def test_imports_only_go_down_the_layers():
    find = layer_of(LAYERS)
    up = upward_imports(import_graph(), find)
    new = sorted(up - set(KNOWN_UPWARD))
    gone = sorted(set(KNOWN_UPWARD) - up)
    names = [n for n, _ in LAYERS]
    assert new == [], "imports that go up a layer:\n" + "\n".join(
        f"  {s} ({names[find(s)]}) -> {d} ({names[find(d)]})"
        for s, d in new  # type: ignore[index]
    )
    assert gone == [], f"no longer imported upward: remove from KNOWN_UPWARD: {gone}"


def test_known_upward_imports_name_real_modules():
    mods = package_modules()
    assert [(s, d) for s, d in sorted(KNOWN_UPWARD) if s not in mods or d not in mods] == []


def test_the_plan_imports_no_solver():
    """The plan layer (plan, cost models) is pure (issue #43): what it measures on the
    training rows comes in as data (``engine.placement.Probes``, built by ``fit.row_probes``
    on ``linalg.spectrum``). It used to import the tile Cholesky's executor
    (``dask_block_size``) and the preconditioner (``policy/spectrum.py``). The dense
    reference's memory estimate (``linalg.dense_memory``) is a formula it may read."""
    found = sorted(
        (src, dst)
        for src, dsts in import_graph().items()
        if src == "pipeline.plan" or src.startswith("pipeline.plan.")
        for dst in dsts
        if dst.startswith("pipeline.linalg.") and dst != "pipeline.linalg.dense_memory"
    )
    assert found == []


def test_the_layers_below_the_models_import_no_scikit_learn_at_module_level():
    """A Dask worker imports the module of each task it runs (tiles, predictions, the
    Gram): scikit-learn costs it 0.7 s of CPU per process, and those layers call it only
    to validate an estimator's input or to subclass a warning made on first use
    (``errors.CGConvergenceWarning``). Only the estimators (``models`` and above) import
    it at module level."""
    models = next(i for i, (name, _) in enumerate(LAYERS) if name.startswith("models"))
    find = layer_of(LAYERS)
    found = []
    for m, path in package_modules().items():
        layer = find(m)
        if layer is None or layer >= models:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                # the lazy warning, taken by name, is made (and scikit-learn imported) at once
                names = [node.module or ""] + [
                    a.name for a in node.names if a.name == "CGConvergenceWarning"
                ]
            else:
                continue
            found += [
                f"{m}: {n}"
                for n in names
                if n in ("sklearn", "CGConvergenceWarning") or n.startswith("sklearn.")
            ]
    assert found == [], "import scikit-learn inside the function that uses it:\n  " + "\n  ".join(
        found
    )
