"""pipeline.diagnostics: private memory (RssAnon) against RSS, which counts mapped files."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from pipeline.diagnostics import current_rss_bytes, private_rss_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def test_private_memory_counts_new_arrays_not_mapped_files(tmp_path):
    path = tmp_path / "f.bin"
    np.ones(25_000_000).tofile(path)  # 200 MB
    before, rss0 = private_rss_bytes(), current_rss_bytes()
    mapped = np.memmap(path, dtype=np.float64, mode="r")
    assert float(mapped.sum()) == 25_000_000.0  # every page touched
    assert current_rss_bytes() - rss0 > 150e6  # RSS counts the mapped file's pages
    assert private_rss_bytes() - before < 50e6  # private memory does not
    del mapped
    before = private_rss_bytes()
    a = np.ones(25_000_000)
    assert private_rss_bytes() - before > 150e6
    del a
