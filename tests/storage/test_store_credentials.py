"""Refused credentials give a clear error before any work (issue #19, bad input).

The loopback S3 server (moto) accepts any credentials, so the refusal is played by a
filesystem whose listing raises ``PermissionError``, which is what s3fs raises for
``AccessDenied``. ``krr run`` maps ``StoreUnreachable`` to its documented exit code.
"""

from __future__ import annotations

import pytest

from pipeline.storage.location import Location, StoreUnreachable


class _Refusing:
    protocol = ("s3", "s3a")

    def invalidate_cache(self) -> None:
        pass

    def ls(self, path, detail=False):
        raise PermissionError(f"Access Denied: {path}")


class _Answering(_Refusing):
    def ls(self, path, detail=False):
        return [f"{path}/run"]


def test_refused_credentials_name_the_fix():
    pytest.importorskip("s3fs")
    loc = Location("s3://some-bucket/run")
    loc.fs = _Refusing()
    with pytest.raises(StoreUnreachable, match="access denied") as e:
        loc.check_usable()
    msg = str(e.value)
    assert "s3://some-bucket/run" in msg and "AWS_ACCESS_KEY_ID" in msg and "storage.options" in msg
    # the same store with credentials that work passes the check (the test can fail)
    loc.fs = _Answering()
    loc.check_usable()


def test_krr_run_turns_refused_credentials_into_exit_7(monkeypatch):
    from types import SimpleNamespace

    import pipeline.storage.location as location
    from pipeline.cli import errors as cli_errors

    monkeypatch.setattr(location, "filesystem_for", lambda url, opts=None: (_Refusing(), "b/run"))
    cfg = SimpleNamespace(storage=SimpleNamespace(options=None, create_bucket=False))
    with pytest.raises(cli_errors.CliError) as e:
        cli_errors._check_store("s3://b/run", cfg)
    assert e.value.code == cli_errors.EXIT_RUN_DIR == 7
    assert "access denied" in str(e.value) and "AWS_ACCESS_KEY_ID" in str(e.value)
