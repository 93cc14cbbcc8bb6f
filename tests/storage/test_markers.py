"""Tile completion markers (:class:`pipeline.storage.TileMarkers`): what ``done()`` lists.

``done()`` lists the markers once and reads them together; it must give what reading each
marker alone gives: only tiles marked under this fingerprint, never a damaged or vanished
marker, and an error of the store raised, not taken for "not done"."""

from __future__ import annotations

import os

import pytest

from pipeline.storage import TileMarkers


def test_done_lists_exactly_the_tiles_marked_under_this_fingerprint(tmp_path):
    m = TileMarkers(str(tmp_path), "gram", "fp-a")
    tiles = [(0, 0), (1, 0), (1, 1), (2, 1)]
    for t in tiles:
        m.mark(t, checksum=1)
    TileMarkers(str(tmp_path), "other", "fp-a").mark((3, 3))
    with open(os.path.join(m.root, "9.9"), "w") as fh:  # a damaged marker
        fh.write("{not json")
    with open(os.path.join(m.root, "8.8.tmp"), "w") as fh:  # a killed writer's leftover
        fh.write('{"fingerprint": "fp-a"}')
    assert m.done() == set(tiles) == {t for t in tiles if m.is_done(t)}
    assert TileMarkers(str(tmp_path), "gram", "fp-b").done() == set()
    assert TileMarkers(str(tmp_path), "never", "fp-a").done() == set()


def test_a_marker_gone_between_listing_and_reading_is_not_done(tmp_path, monkeypatch):
    m = TileMarkers(str(tmp_path), "gram", "fp")
    for t in [(0, 0), (1, 0)]:
        m.mark(t)
    listed = m.fs.ls(m.root, detail=False)
    m.unmark((1, 0))
    monkeypatch.setattr(m.fs, "ls", lambda *a, **k: listed)
    assert m.done() == {(0, 0)}


def test_a_store_error_while_reading_the_markers_is_raised(tmp_path, monkeypatch):
    m = TileMarkers(str(tmp_path), "gram", "fp")
    m.mark((0, 0))

    def cat(paths, on_error="raise", **kw):
        assert on_error == "return"
        return {p: TimeoutError("the store does not answer") for p in paths}

    monkeypatch.setattr(m.fs, "cat", cat)
    with pytest.raises(TimeoutError, match="does not answer"):
        m.done()


def test_reading_the_markers_together_is_one_call(tmp_path, monkeypatch):
    m = TileMarkers(str(tmp_path), "gram", "fp")
    for t in [(0, 0), (1, 0), (1, 1)]:
        m.mark(t)
    calls = []
    real = m.fs.cat

    def cat(paths, **kw):  # one call for every marker (an object store sends them together)
        calls.append(len(paths))
        return real(paths, **kw)

    monkeypatch.setattr(m.fs, "cat", cat)
    assert m.done() == {(0, 0), (1, 0), (1, 1)}
    assert calls == [3]
