"""Checkpoints for CG: save the state every k iterations, resume after a kill.

The state (x, r, p, z, r·z, active columns, residual history) is written to the
run store as one ``.npz`` in one of two slots, alternately; then a marker
(:class:`pipeline.storage.TileMarkers`, written last and atomically) records
which slot holds the latest complete state, at which iteration, and the
CRC-32C of the slot's bytes. A kill during a write leaves the marker pointing
at the previous, complete slot; a slot whose bytes no longer match the checksum
is never resumed from (the solve starts afresh, with a warning).

The marker carries a fingerprint of the operator (its K and shift λ), the
preconditioner, the right-hand side y and tol, so a checkpoint is resumed only
by the same solve; any other solve ignores it and starts from the beginning.
"""

from __future__ import annotations

import io
import json
import logging
import zipfile
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
import numpy as np

from pipeline.linalg.cg import CGResult, CGState, conjugate_gradient
from pipeline.linalg.precond import IdentityPreconditioner
from pipeline.storage import TileMarkers, fingerprint_blocks, fingerprint_obj
from pipeline.storage.arrays import bytes_checksum
from pipeline.storage.atomic import atomic_write, is_local
from pipeline.storage.fingerprint import same_work
from pipeline.storage.tempfiles import sweep_tmp_files

__all__ = ["CGCheckpoint", "SlotCheckpoint", "cg_fingerprint", "resumable_cg"]

log = logging.getLogger(__name__)

_KEY = "state"


def cg_fingerprint(
    operator_fp: str,
    preconditioner_fp: str,
    b: np.ndarray,
    tol: float,
    extra: dict | None = None,
) -> str:
    """Fingerprint of a CG solve: operator (K, λ), preconditioner, right-hand side, tol."""
    b = np.asarray(b, dtype=np.float64)
    return fingerprint_obj(
        {
            "operator": operator_fp,
            "preconditioner": preconditioner_fp,
            "y": fingerprint_blocks([b.reshape(b.shape[0], -1)]),
            "tol": float(tol),
            **(extra or {}),
        }
    )


class SlotCheckpoint:
    """Two alternating ``.npz`` slots and a marker written last: the storage contract of
    every resumable state in the package (CG's, :class:`CGCheckpoint`; the Nyström
    direct pass's, :mod:`pipeline.linalg.nystrom_solve`).

    A state (named arrays and a JSON ``meta``) is written to the free slot atomically
    (fsync), then the marker (:class:`pipeline.storage.TileMarkers`, atomic) records the
    slot, the state's position and the CRC-32C of the slot's bytes. A kill during a write
    leaves the marker on the previous, complete slot; a slot whose bytes do not match its
    checksum, or whose ``meta`` names another fingerprint or position, is never read back
    (a warning; the caller starts afresh).

    Parameters
    ----------
    store : str
        Run store root (local directory or fsspec URL).
    fingerprint : str
        Identity of the work: only a state saved under the same one is loaded.
    marker : str
        The marker's name in the store (``_markers/<marker>/state``).
    folder : str
        The slots' folder under the store root (``<folder>/slot{0,1}.npz``).
    position : str
        The name of the position field in the marker and ``meta`` (``"iteration"``).
    label : str
        The state's name in warnings.
    """

    def __init__(
        self, store: str, fingerprint: str, *, marker: str, folder: str,
        position: str = "iteration", label: str = "CG checkpoint",
    ) -> None:  # fmt: skip
        self.store = str(store)
        self.fingerprint = fingerprint
        self.position = position
        self.label = label
        self.markers = TileMarkers(self.store, marker, fingerprint)
        self.fs, root = fsspec.core.url_to_fs(self.store)
        self.root = f"{root.rstrip('/')}/{folder}"
        if is_local(self.fs):  # checkpoint writes a killed solve left half done
            sweep_tmp_files(self.root)
            self.markers.sweep_tmp()
        rec = self.markers.record(_KEY)
        self._slot = int(rec["slot"]) if rec else 1
        self.n_saved = 0

    def _write(self, path: str, data: bytes) -> None:
        atomic_write(path, data, fs=self.fs, fsync=True)

    def write_state(
        self, arrays: dict[str, Any], meta: dict[str, Any], position: int, **extra: Any
    ) -> None:
        """``arrays`` and ``meta`` (its last entry) to the free slot, then the marker:
        ``slot``, ``position``, ``crc32c`` and ``extra``."""
        slot = 1 - self._slot
        buf = io.BytesIO()
        meta_bytes = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        np.savez(buf, **arrays, meta=meta_bytes)
        data = buf.getvalue()
        self._write(f"{self.root}/slot{slot}.npz", data)
        self.markers.mark(
            _KEY, slot=slot, **{self.position: int(position)}, crc32c=bytes_checksum(data),
            **extra,
        )  # fmt: skip
        self._slot = slot
        self.n_saved += 1

    def read_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """The latest state's ``(arrays, meta)``, or None (none, another fingerprint, or
        an unreadable or corrupt slot: with a warning)."""
        rec = self.markers.record(_KEY)
        if rec is None:
            return None
        path = f"{self.root}/slot{int(rec['slot'])}.npz"
        try:
            data = self.fs.cat_file(path)
            if "crc32c" not in rec:
                log.warning("%s %s has no recorded checksum; starting afresh", self.label, path)
                return None
            found = bytes_checksum(data)
            if found != int(rec["crc32c"]):
                log.warning(
                    "%s %s is corrupt (crc32c recorded %#010x, its bytes hash to "
                    "%#010x); ignoring it and starting afresh",
                    self.label,
                    path,
                    int(rec["crc32c"]),
                    found,
                )
                return None
            with np.load(io.BytesIO(data)) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                if (
                    not same_work(meta["fingerprint"], self.fingerprint)
                    or meta[self.position] != rec[self.position]
                ):
                    log.warning("checkpoint slot %s does not match its marker; ignoring it", path)
                    return None
                return {k: z[k] for k in z.files if k != "meta"}, meta
        except (FileNotFoundError, OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            log.warning("cannot read %s %s (%s); starting afresh", self.label, path, e)
            return None

    def record(self) -> dict[str, Any] | None:
        """The marker's record of the latest state, or None."""
        return self.markers.record(_KEY)

    def clear(self) -> None:
        """Delete the saved states and the marker."""
        self.markers.clear()
        if self.fs.exists(self.root):
            self.fs.rm(self.root, recursive=True)


class CGCheckpoint(SlotCheckpoint):
    """Saves a :class:`CGState` every ``every`` iterations; loads the latest one.

    Use an instance as (part of) the ``callback`` of
    :func:`pipeline.linalg.cg.conjugate_gradient`. The slots are ``_cg/<name>/slot{0,1}.npz``,
    the marker ``_markers/cg-<name>/state`` (:class:`SlotCheckpoint`).

    Parameters
    ----------
    store : str
        Run store root (local directory or fsspec URL).
    fingerprint : str
        Identity of the solve (see :func:`cg_fingerprint`).
    name : str
        Name of this solve inside the store (several solves may share a store).
    every : int
        Save every ``every`` iterations (k >= 1).
    """

    def __init__(
        self, store: str, fingerprint: str, *, name: str = "cg", every: int = 10,
        tiling: Any = None,
    ) -> None:  # fmt: skip
        if int(every) != every or every < 1:
            raise ValueError(f"checkpoint interval 'every' must be an integer >= 1, got {every!r}")
        super().__init__(store, fingerprint, marker=f"cg-{name}", folder=f"_cg/{name}")
        self.name = name
        self.every = int(every)
        #: what else fixes the iterates' bits (e.g. the matrix-free product's tile size,
        #: which its fingerprint leaves out): recorded, and required to adopt a state
        self.tiling = tiling

    # -- writing --------------------------------------------------------------
    def save(self, state: CGState) -> None:
        """Write ``state`` to the free slot, then point the marker at it."""
        self.write_state(
            {
                "x": state.x,
                "r": state.r,
                "p": state.p,
                "z": state.z,
                "rz": state.rz,
                "b_norm": state.b_norm,
                "active": state.active,
                "history": np.vstack(state.history),
            },
            {
                "iteration": state.iteration,
                "n_matvec": state.n_matvec,
                "fingerprint": self.fingerprint,
            },
            int(state.iteration),
            **({"tiling": self.tiling} if self.tiling is not None else {}),
        )

    def __call__(self, state: CGState) -> None:
        if state.iteration % self.every == 0 or not state.active.any():
            self.save(state)

    # -- reading --------------------------------------------------------------
    def load(self) -> CGState | None:
        """The latest saved state of this solve, or None (none, or another fingerprint)."""
        got = self.read_state()
        if got is None:
            return None
        z, meta = got
        return CGState(
            x=z["x"],
            r=z["r"],
            p=z["p"],
            z=z["z"],
            rz=z["rz"],
            b_norm=z["b_norm"],
            active=z["active"].astype(bool),
            iteration=int(meta["iteration"]),
            n_matvec=int(meta["n_matvec"]),
            history=list(z["history"]),
        )

    @property
    def iteration(self) -> int | None:
        """Iteration of the latest saved state, or None."""
        rec = self.record()
        return None if rec is None else int(rec["iteration"])


def resumable_cg(
    operator: Any,
    b: np.ndarray,
    store: str,
    *,
    preconditioner: Any = None,
    name: str = "cg",
    every: int = 10,
    tol: float = 1e-6,
    max_iter: int | None = None,
    x0: np.ndarray | None = None,
    callback: Callable[[CGState], Any] | None = None,
    strict: bool = False,
    true_residual_every: int = 50,
    fingerprint: str | None = None,
    adopt_from: Sequence[str] = (),
    tiling: Any = None,
) -> CGResult:
    """CG on ``operator`` (a :class:`KernelOperator`, or any callable with a
    ``fingerprint``) that checkpoints to ``store`` every ``every`` iterations and
    resumes from the latest checkpoint of the same solve.

    ``fingerprint`` defaults to :func:`cg_fingerprint` of the operator's and the
    preconditioner's fingerprints, ``b`` and ``tol``. ``x0`` is used only when
    there is no checkpoint to resume. Other parameters are those of
    :func:`pipeline.linalg.cg.conjugate_gradient`; ``result.start_iter`` tells
    where the solve resumed. ``adopt_from``: other stores whose checkpoints of the
    same solve (same fingerprint, so the same iterates) may be resumed, read only,
    when ``store`` holds none, e.g. another configuration's that differs only in
    ``max_iter`` or ``allow_unconverged``; only a state recorded with the same
    ``tiling`` (anything else that fixes the iterates' bits) is adopted.
    """
    b = np.asarray(b, dtype=np.float64)
    if not np.all(np.isfinite(b)):
        raise ValueError("the right-hand side y contains NaN or infinite values; clean it first")
    if fingerprint is None:
        pre = preconditioner if preconditioner is not None else IdentityPreconditioner()
        pre_fp = getattr(pre, "fingerprint", None)
        op_fp = getattr(operator, "fingerprint", None)
        if op_fp is None or pre_fp is None:
            raise ValueError(
                "resumable_cg needs fingerprint= when the operator or the preconditioner has no "
                "'fingerprint' attribute"
            )
        fingerprint = cg_fingerprint(op_fp, pre_fp, b, tol)
    ckpt = CGCheckpoint(store, fingerprint, name=name, every=every, tiling=tiling)
    state = ckpt.load()
    if state is not None:
        log.info("resuming CG %r from iteration %d", name, state.iteration)
    for other in adopt_from if state is None and tiling is not None else ():
        try:
            theirs = CGCheckpoint(other, fingerprint, name=name, every=every)
            # the same products bit for bit: their tiling too (a matrix-free product's
            # rounding follows its tiles; a state from another tiling gave another alpha)
            # (the tiling is not in the checkpoint's fingerprint, whose recipe is pinned:
            # the adopted work is named by both)
            recorded = (theirs.markers.record(_KEY) or {}).get("tiling")
            same = same_work(
                fingerprint_obj([fingerprint, recorded]), fingerprint_obj([fingerprint, tiling])
            )
            found = theirs.load() if same else None
        except (OSError, ValueError):  # unreadable: not a state to resume
            continue
        if found is None or (max_iter is not None and found.iteration > max_iter):
            continue  # past this solve's max_iter: its iterate is not this solve's answer
        if state is None or found.iteration > state.iteration:
            state = found
            log.info("resuming CG %r from iteration %d of the same solve in %s", name,
                     found.iteration, other)  # fmt: skip

    def cb(st: CGState) -> Any:
        ckpt(st)
        return callback(st) if callback is not None else None

    matvec = operator.matvec if hasattr(operator, "matvec") else operator
    return conjugate_gradient(
        matvec,
        b,
        x0=x0 if state is None else None,
        preconditioner=preconditioner,
        tol=tol,
        max_iter=max_iter,
        callback=cb,
        strict=strict,
        true_residual_every=true_residual_every,
        state=state,
    )
