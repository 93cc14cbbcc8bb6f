"""The S3 filesystem the pipeline uses: s3fs with bounded waits.

s3fs (through aiobotocore) waits 60 s per socket read, retries each request several
times inside botocore and again five times in s3fs, and sets no limit on a whole
operation, so a store that accepts connections but never answers (a server paused
mid-run) held ``krr run`` for many minutes. :class:`BoundedS3FileSystem` is registered
for ``s3://`` and ``s3a://`` by :mod:`pipeline.storage.location` (in every process that
imports the pipeline, Dask workers included). It sets a connect and a read timeout on
every request, the number of tries, and a total per operation; an operation that gets
no answer within them raises :class:`~pipeline.errors.StoreUnreachable` ("the object
store does not answer"). Each can be set in ``storage.options`` (or the estimator's
``storage_options``); see ``docs/STORAGE.md``.

It also spares two requests s3fs makes that the pipeline's objects do not need: the size
request (HEAD) before each whole-object read, and the bucket request before each write
(see :meth:`BoundedS3FileSystem._cat_file` and :meth:`BoundedS3FileSystem._makedirs`).
With the reuse of opened arrays (:meth:`pipeline.storage.arrays.TiledArray._tile_zarr`), a
small ``krr run`` on a loopback S3 made 813 requests before, 405 after.

And it parses botocore's data files once per process, not once per filesystem instance
(:meth:`BoundedS3FileSystem.set_session`). fsspec caches an instance per thread, so each
tile thread made its own botocore session, and each session read and parsed the endpoint
and S3 model files again: 0.16 s of CPU per instance, 0.035 s with one loader shared.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from typing import Any

from fsspec.asyn import sync_wrapper
from s3fs import S3FileSystem

from pipeline.errors import ConfigError, StoreUnreachable
from pipeline.storage.waits import store_wait_cap

#: botocore's data loaders, one per data path (``AWS_DATA_PATH``) in this process
_LOADERS: dict[str | None, Any] = {}

#: the defaults, each a key of ``storage.options`` (seconds; ``retries``: tries per operation)
DEFAULT_TIMEOUTS: dict[str, float] = {
    "connect_timeout": 10.0,
    "read_timeout": 20.0,
    "retries": 3,
    "operation_timeout": 60.0,
}


#: whether this s3fs splits a whole-object read into concurrent ranged reads (s3fs 2025 and
#: later: it first asks for the object's size, one HEAD per read, and splits objects
#: larger than its ``default_block_size``, 50 MB)
_SPLITS_READS = "max_concurrency" in inspect.signature(S3FileSystem._cat_file).parameters


def _no_answer_types() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import (
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    return (
        ConnectTimeoutError,
        ReadTimeoutError,
        EndpointConnectionError,
        asyncio.TimeoutError,
        TimeoutError,
    )


class BoundedS3FileSystem(S3FileSystem):
    """:class:`s3fs.S3FileSystem` whose every request has a connect and a read timeout
    and whose every operation has a total (see :data:`DEFAULT_TIMEOUTS`).

    Parameters (besides those of s3fs)
    ----------------------------------
    connect_timeout, read_timeout : float
        Seconds to open a connection, and to wait for each read of an answer.
    retries : int
        Tries per operation (s3fs's own retry loop; botocore's is set to one try).
    operation_timeout : float
        Seconds one operation (all its tries together) may take.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        opts = {k: kwargs.pop(k, v) for k, v in DEFAULT_TIMEOUTS.items()}
        for k, v in opts.items():
            if isinstance(v, str):  # from the environment: FSSPEC_S3_READ_TIMEOUT=5
                try:
                    opts[k] = v = float(v)
                except ValueError:
                    pass
            if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
                raise ConfigError(
                    f"storage.options {k}={v!r}: expected a positive number "
                    f"(default {DEFAULT_TIMEOUTS[k]:g})"
                )
        config = dict(kwargs.pop("config_kwargs", None) or {})
        config.setdefault("connect_timeout", float(opts["connect_timeout"]))
        config.setdefault("read_timeout", float(opts["read_timeout"]))
        config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
        super().__init__(*args, config_kwargs=config, **kwargs)
        self.retries = max(1, int(opts["retries"]))
        self.operation_timeout = float(opts["operation_timeout"])
        self._buckets_seen: set[str] = set()
        self._endpoint_shown = (  # the environment as it was when this instance was made
            (self.client_kwargs or {}).get("endpoint_url")
            or self.endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL")
            or "S3"
        )

    def _no_answer(
        self, method: str, e: BaseException | None, capped: float | None = None
    ) -> StoreUnreachable:
        """The error of an operation that got no answer: within the operation timeout,
        or within ``capped`` seconds of the interrupt that capped the waits."""
        endpoint = self._endpoint_shown
        why = f"{type(e).__name__}: {e}" if e is not None and str(e) else "no reply"
        within = (
            f"{self.operation_timeout:g} s, storage.options operation_timeout"
            if capped is None
            else f"{capped:g} s, the wait left after an interrupt"
        )
        return StoreUnreachable(
            f"{endpoint}: the object store does not answer ({method}: {why}; within "
            f"{within}). Check the "
            "endpoint (AWS_ENDPOINT_URL, or storage.options client_kwargs.endpoint_url) "
            "and the network, then rerun the same command to resume."
        )

    async def _cat_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
        """s3fs's read, in one GET for a whole object: without the HEAD before it that
        s3fs sends to learn whether to split it. The pipeline's objects (markers,
        metadata, tiles: 32 MB for a float64 tile of 2,048) are read whole and mostly
        small, and its tile reads already run side by side, so that HEAD only doubled
        the requests. The whole read (the request and the reading of its body) is one
        operation of the bounded waits: a body that stops arriving is given up as a
        request that gets no answer is, after an interrupt within seconds too."""
        whole = len(args) < 2 and kwargs.get("start") is None and kwargs.get("end") is None
        if _SPLITS_READS and whole and kwargs.get("max_concurrency") is None:
            kwargs["max_concurrency"] = 1
        # the body's read too, not only the request, within the bounded waits
        return await self._bounded("get_object", super()._cat_file(path, *args, **kwargs))

    async def set_session(self, refresh: bool = False, kwargs: dict | None = None) -> Any:
        """s3fs's session and client, with this process's one botocore data loader.

        A session of this instance's own (the first, and each one a ``refresh`` makes anew)
        is made here as s3fs makes it (``AioSession`` with the instance's session
        arguments), with the loader of its data path put in: the endpoint and S3 model
        files it parses are kept for every later session. botocore reads them only (one
        session's clients already share them). A session the caller gave is theirs,
        untouched."""
        owned = getattr(self, "_session_is_owned", False)
        if self.session is not None and not (refresh and owned):
            return await super().set_session(refresh, kwargs or {})
        from aiobotocore.session import AioSession
        from botocore.loaders import create_loader

        session = AioSession(**self.kwargs)
        path = session.get_config_variable("data_path")
        loader = _LOADERS.get(path)
        if loader is None:
            loader = _LOADERS.setdefault(path, create_loader(path))
        session.register_component("data_loader", loader)
        self.session = session
        # s3fs (2025+) makes an owned session anew on a refresh: this one is kept
        # through s3fs's own set-up, then owned again (the next refresh comes back here)
        self._session_is_owned = False
        try:
            return await super().set_session(refresh, kwargs or {})
        finally:
            self._session_is_owned = True

    connect = sync_wrapper(set_session)  # (s3fs binds its own: name this one)

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        """A bucket has no directories: below a bucket this process has already made or
        seen, there is nothing to make (s3fs would ask for the bucket again, one HEAD
        before every marker and manifest written). The first call for a bucket is
        s3fs's own."""
        bucket, key, _ = self.split_path(path)
        if key and exist_ok and bucket in self._buckets_seen:
            return
        await super()._makedirs(path, exist_ok=exist_ok)
        self._buckets_seen.add(bucket)

    makedirs = sync_wrapper(_makedirs)  # (s3fs binds its own: name this one)

    async def _call_s3(self, method: Any, *akwarglist: Any, **kwargs: Any) -> Any:
        name = method if isinstance(method, str) else getattr(method, "__name__", "request")
        return await self._bounded(name, super()._call_s3(method, *akwarglist, **kwargs))

    async def _bounded(self, name: str, operation: Any) -> Any:
        """Await ``operation`` within :data:`DEFAULT_TIMEOUTS`'s total, or within
        seconds once an interrupt capped the store's waits
        (:func:`~pipeline.storage.waits.store_wait_cap`); else
        :class:`~pipeline.errors.StoreUnreachable` naming ``name``."""
        start = time.monotonic()
        task = asyncio.ensure_future(operation)
        try:
            while True:
                deadline, capped = start + self.operation_timeout, None
                cap = store_wait_cap()  # cleanup after an interrupt: give up sooner
                if cap is not None and max(start, cap[0]) + cap[1] < deadline:
                    deadline, capped = max(start, cap[0]) + cap[1], cap[1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._no_answer(name, None, capped)
                done, _ = await asyncio.wait({task}, timeout=min(left, 0.5))
                if done:
                    return task.result()
        except _no_answer_types() as e:
            raise self._no_answer(name, e) from e
        finally:
            if not task.done():
                task.cancel()


# one instance cache with s3fs's (fsspec gives each class its own): whoever resets
# ``s3fs.S3FileSystem.clear_instance_cache()`` (e.g. after changing AWS_ENDPOINT_URL)
# resets these too; the cache keys name the class, so instances never mix
BoundedS3FileSystem._cache = S3FileSystem._cache
