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
from pipeline.storage.tempfiles import sweep_tmp_files

__all__ = ["CGCheckpoint", "cg_fingerprint", "resumable_cg"]

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


class CGCheckpoint:
    """Saves a :class:`CGState` every ``every`` iterations; loads the latest one.

    Use an instance as (part of) the ``callback`` of
    :func:`pipeline.linalg.cg.conjugate_gradient`.

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
        self.store = str(store)
        self.fingerprint = fingerprint
        self.name = name
        self.every = int(every)
        #: what else fixes the iterates' bits (e.g. the matrix-free product's tile size,
        #: which its fingerprint leaves out): recorded, and required to adopt a state
        self.tiling = tiling
        self.markers = TileMarkers(self.store, f"cg-{name}", fingerprint)
        self.fs, root = fsspec.core.url_to_fs(self.store)
        self.root = f"{root.rstrip('/')}/_cg/{name}"
        if is_local(self.fs):  # checkpoint writes a killed solve left half done
            sweep_tmp_files(self.root)
            self.markers.sweep_tmp()
        rec = self.markers.record(_KEY)
        self._slot = int(rec["slot"]) if rec else 1
        self.n_saved = 0

    # -- writing --------------------------------------------------------------
    def _write(self, path: str, data: bytes) -> None:
        atomic_write(path, data, fs=self.fs, fsync=True)

    def save(self, state: CGState) -> None:
        """Write ``state`` to the free slot, then point the marker at it."""
        slot = 1 - self._slot
        buf = io.BytesIO()
        np.savez(
            buf,
            x=state.x,
            r=state.r,
            p=state.p,
            z=state.z,
            rz=state.rz,
            b_norm=state.b_norm,
            active=state.active,
            history=np.vstack(state.history),
            meta=np.frombuffer(
                json.dumps(
                    {
                        "iteration": state.iteration,
                        "n_matvec": state.n_matvec,
                        "fingerprint": self.fingerprint,
                    }
                ).encode(),
                dtype=np.uint8,
            ),
        )
        data = buf.getvalue()
        self._write(f"{self.root}/slot{slot}.npz", data)
        self.markers.mark(
            _KEY,
            slot=slot,
            iteration=int(state.iteration),
            crc32c=bytes_checksum(data),
            **({"tiling": self.tiling} if self.tiling is not None else {}),
        )
        self._slot = slot
        self.n_saved += 1

    def __call__(self, state: CGState) -> None:
        if state.iteration % self.every == 0 or not state.active.any():
            self.save(state)

    # -- reading --------------------------------------------------------------
    def load(self) -> CGState | None:
        """The latest saved state of this solve, or None (none, or another fingerprint)."""
        rec = self.markers.record(_KEY)
        if rec is None:
            return None
        path = f"{self.root}/slot{int(rec['slot'])}.npz"
        try:
            data = self.fs.cat_file(path)
            if "crc32c" not in rec:
                log.warning("CG checkpoint %s has no recorded checksum; starting afresh", path)
                return None
            found = bytes_checksum(data)
            if found != int(rec["crc32c"]):
                log.warning(
                    "CG checkpoint %s is corrupt (crc32c recorded %#010x, its bytes hash to "
                    "%#010x); ignoring it and starting afresh",
                    path,
                    int(rec["crc32c"]),
                    found,
                )
                return None
            with np.load(io.BytesIO(data)) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                if meta["fingerprint"] != self.fingerprint or meta["iteration"] != rec["iteration"]:
                    log.warning("checkpoint slot %s does not match its marker; ignoring it", path)
                    return None
                history = list(z["history"])
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
                    history=history,
                )
        except (FileNotFoundError, OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            log.warning("cannot read CG checkpoint %s (%s); starting afresh", path, e)
            return None

    @property
    def iteration(self) -> int | None:
        """Iteration of the latest saved state, or None."""
        rec = self.markers.record(_KEY)
        return None if rec is None else int(rec["iteration"])

    def clear(self) -> None:
        """Delete the saved states and the marker."""
        self.markers.clear()
        if self.fs.exists(self.root):
            self.fs.rm(self.root, recursive=True)


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
            same = (theirs.markers.record(_KEY) or {}).get("tiling") == tiling
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
