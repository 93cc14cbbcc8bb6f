"""A benchmark's targets: each measured figure checked against its bound, and the exit code.

Issue #43: a benchmark that prints ``NOT met`` and exits 0 hides a missed target from
whatever runs it. Each benchmark that states targets makes one :class:`Targets`, passes
every stated target through :meth:`Targets.check` (one aligned ``TARGET`` line each) and
ends with ``return targets.finish()``, so that ``raise SystemExit(main())`` exits 1 when
any target was missed. A target stated for one configuration only (a size, a data set)
is checked in that configuration; elsewhere :meth:`Targets.skip` says so and nothing is
counted::

    targets = Targets()
    targets.check("fit seconds", 612.4, "<=", 720, " s")
    ...
    return targets.finish()
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import asdict, dataclass

#: the comparisons a target may state, value ``op`` bound
OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
#: names are padded to this width, so that the values of short names line up
NAME_WIDTH = 40


@dataclass(frozen=True)
class Checked:
    """One checked target: ``value op bound`` in ``unit``, and whether it held."""

    name: str
    value: float
    op: str
    bound: float
    unit: str
    met: bool


class Targets:
    """The targets one benchmark run checked, printed as they are checked.

    Parameters
    ----------
    fmt : str
        Format spec of the measured values in the printed lines (bounds print with
        ``g``, as stated).
    """

    def __init__(self, fmt: str = ".4g") -> None:
        self.fmt = fmt
        self.checked: list[Checked] = []
        self.skipped: list[str] = []

    def line(self, c: Checked) -> str:
        """The printed line of one checked target."""
        return (
            f"TARGET  {c.name + ':':<{NAME_WIDTH}} {c.value:{self.fmt}}{c.unit} "
            f"(target {c.op} {c.bound:g}{c.unit}): {'met' if c.met else 'NOT met'}"
        )

    def check(self, name: str, value: float, op: str, bound: float, unit: str = "") -> bool:
        """Check ``value op bound``, print its line, record it and return whether it held.

        Parameters
        ----------
        name : str
            What was measured, as the line names it.
        value : float
            The measured figure. NaN never meets a target.
        op : {"<=", ">=", "<", ">"}
            The comparison the target states.
        bound : float
            The stated bound.
        unit : str
            Printed after the value and the bound (e.g. ``" s"``, ``" GB"``, ``"x"``).

        Returns
        -------
        bool
            True when the target was met.
        """
        if op not in OPS:
            raise ValueError(f"op must be one of {sorted(OPS)}, not {op!r}")
        value = float(value)
        met = not math.isnan(value) and bool(OPS[op](value, float(bound)))
        c = Checked(name, value, op, float(bound), unit, met)
        self.checked.append(c)
        print(self.line(c), flush=True)
        return met

    def skip(self, name: str, why: str) -> None:
        """Say that a target is not checked in this run, and why (not counted).

        Parameters
        ----------
        name : str
            The target, as :meth:`check` would name it.
        why : str
            Why not: usually that the run is not the configuration the target is for.
        """
        self.skipped.append(name)
        print(f"TARGET  {name + ':':<{NAME_WIDTH}} not checked ({why})", flush=True)

    @property
    def missed(self) -> list[Checked]:
        """The checked targets that were not met."""
        return [c for c in self.checked if not c.met]

    def summary(self) -> str:
        """One line: how many targets were met and missed (and skipped, if any)."""
        n_missed = len(self.missed)
        s = f"targets: {len(self.checked) - n_missed} met, {n_missed} NOT met"
        return s + (f", {len(self.skipped)} not checked" if self.skipped else "")

    def exit_code(self) -> int:
        """1 when any checked target was missed, else 0 (also when none was checked)."""
        return 1 if self.missed else 0

    def finish(self) -> int:
        """Print :meth:`summary` and return :meth:`exit_code` (``return targets.finish()``)."""
        print(self.summary(), flush=True)
        return self.exit_code()

    def as_json(self) -> list[dict]:
        """The checked targets as plain dicts (for a benchmark's JSON output)."""
        return [asdict(c) for c in self.checked]
