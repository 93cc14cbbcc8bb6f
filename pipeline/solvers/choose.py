"""``solver="auto"``: pick the blocked Cholesky or CG from N, D, free disk and memory.

A pure function of its arguments (no probing of the machine), so the estimator
can log the choice with its reason and tests can pin it. The cost model uses
the figures measured on this project's machine (docs NOTES.md): float64 kernel
tiles at about 7 ns per entry per core, a blocked Cholesky at about 60 GFLOP/s,
and a Nyström-preconditioned CG needing on the order of 100 products.
"""

from __future__ import annotations

__all__ = ["choose_matvec_mode", "choose_solver", "cholesky_disk_bytes", "cg_memory_bytes"]

#: Above this N, CG (about 100 products of N² entries) beats a Cholesky (N³/3 flops).
CHOLESKY_MAX_N = 30_000
#: Disk margin: leave this fraction of the free space unused.
DISK_MARGIN = 0.8


def cholesky_disk_bytes(n: int, itemsize: int = 8) -> int:
    """Disk a blocked Cholesky needs: the lower-tiled Gram plus its lower factor."""
    return 2 * (n * (n + 1) // 2) * itemsize


def gram_disk_bytes(n: int, itemsize: int = 8) -> int:
    """Disk of the lower-tiled Gram alone (what a stored-matvec CG reads)."""
    return (n * (n + 1) // 2) * itemsize


def cg_memory_bytes(n: int, n_features: int, rank: int = 500, n_rhs: int = 1) -> int:
    """Memory CG needs beyond a few tiles: X, the Nyström factor, six work vectors per RHS."""
    return 8 * n * (n_features + 2 * rank + 6 * n_rhs)


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def choose_solver(
    n: int,
    n_features: int,
    disk_free: float,
    mem_free: float,
    *,
    rank: int = 500,
    cholesky_max_n: int = CHOLESKY_MAX_N,
) -> tuple[str, str]:
    """Choose ``"cholesky"`` or ``"cg"`` for an N x N kernel system.

    Parameters
    ----------
    n, n_features : int
        Training samples N and features D.
    disk_free, mem_free : float
        Free bytes in the run store and in memory.
    rank : int
        Nyström rank CG would use (for its memory estimate).
    cholesky_max_n : int
        Largest N for which the exact Cholesky is preferred when it fits.

    Returns
    -------
    (name, reason) : tuple of str
        ``name`` is ``"cholesky"`` or ``"cg"``; ``reason`` says why, with the
        figures used, for the log.
    """
    if n < 1 or n_features < 1:
        raise ValueError(f"n and n_features must be >= 1, got n={n}, n_features={n_features}")
    if disk_free < 0 or mem_free < 0:
        raise ValueError(f"free disk and memory must be >= 0, got {disk_free}, {mem_free}")
    need_disk = cholesky_disk_bytes(n)
    need_mem = cg_memory_bytes(n, n_features, min(rank, n))
    usable_disk = DISK_MARGIN * disk_free
    cg_fits_memory = need_mem <= DISK_MARGIN * mem_free
    if need_disk > usable_disk:
        if not cg_fits_memory:
            return (
                "cg",
                f"N={n}: neither fits: the Cholesky needs {_gb(need_disk)} of disk "
                f"({_gb(usable_disk)} usable) and CG with rank {min(rank, n)} about "
                f"{_gb(need_mem)} of memory ({_gb(mem_free)} free); CG is the only option, "
                "lower the Nyström rank",
            )
        return (
            "cg",
            f"N={n}: the Gram and Cholesky factor need {_gb(need_disk)} of disk but only "
            f"{_gb(usable_disk)} of {_gb(disk_free)} free is usable; matrix-free CG needs "
            f"no store and about {_gb(need_mem)} of memory",
        )
    if not cg_fits_memory:
        return (
            "cholesky",
            f"N={n}: CG would need about {_gb(need_mem)} of memory but {_gb(mem_free)} is "
            f"free, while the out-of-core Cholesky's {_gb(need_disk)} fit on disk",
        )
    if n > cholesky_max_n:
        return (
            "cg",
            f"N={n} > {cholesky_max_n}: a Cholesky costs N³/3 = {n**3 / 3e12:.1f} TFLOP (about "
            f"{n**3 / 3 / 60e9 / 60:.0f} min at 60 GFLOP/s), more than ~100 CG products "
            f"of N² kernel entries",
        )
    return (
        "cholesky",
        f"N={n} <= {cholesky_max_n} and the Gram plus factor ({_gb(need_disk)}) fit in "
        f"{_gb(usable_disk)} of usable disk: the exact blocked Cholesky is cheaper than CG here",
    )


def choose_matvec_mode(n: int, n_features: int, disk_free: float) -> tuple[str, str]:
    """``"stored"`` or ``"matrix-free"`` for CG, with the reason.

    Reading a stored float64 entry (8 bytes at about 1 GB/s) costs about as much
    as recomputing a low-dimensional RBF entry, so a store pays off only when the
    kernel is costly to evaluate (many features) and the Gram fits on disk.
    """
    need = gram_disk_bytes(n)
    if need > DISK_MARGIN * disk_free:
        return "matrix-free", f"the Gram ({_gb(need)}) does not fit in the free disk"
    if n_features >= 64:
        return (
            "stored",
            f"D={n_features}: an entry costs O(D) to recompute but 8 bytes to read, and the "
            f"Gram ({_gb(need)}) fits on disk",
        )
    return (
        "matrix-free",
        f"D={n_features} is small: recomputing a kernel entry costs about as much as reading "
        "it back, and no store is needed",
    )
