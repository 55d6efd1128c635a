"""Input integrity: an input changed, emptied or deleted while a job runs fails
the job naming it, and the output is never marked complete; a chunk missing
from a complete tilearray output is an error naming array and tile; targets
that are inputs (through symbolic links) or not Zarr arrays are refused."""

import asyncio
import os
import shutil
import threading

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore, WrapperStore

import tilearray as ta
from tilearray.storage import ArrayRef, is_complete
from tilearray.testing import assert_close

N, TILE = 64, 16

_gates: dict = {}


class GateStore(WrapperStore):
    """Holds the job at its ``after``-th done marker: the marker write waits
    until the test has changed an input (``threading.Event``s in a
    process-global registry: use an in-process engine)."""

    def __init__(self, store, name="gate", after=1):
        super().__init__(store)
        self.name, self.after = name, after

    def __reduce__(self):
        return (type(self), (self._store, self.name, self.after))

    def _with_store(self, store):
        return type(self)(store, self.name, self.after)

    def __eq__(self, other):
        return type(self) is type(other) and self.name == other.name \
            and self._store == other._store

    async def set(self, key, value):
        if "tilearray.done/" in key:
            g = _gates[self.name]
            with g["lock"]:
                g["count"] += 1
                mine = g["count"]
            if mine == self.after:
                g["reached"].set()
                while not g["release"].is_set():  # never block zarr's event loop
                    await asyncio.sleep(0.005)
        await self._store.set(key, value)


def _gate(name, after):
    _gates[name] = {"lock": threading.Lock(), "count": 0, "reached": threading.Event(),
                    "release": threading.Event()}
    return name, after


def _inputs(tmp_path, rng):
    x, y = rng.standard_normal((N, N)), rng.standard_normal((N, N))
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(TILE, TILE))
    b = ta.from_numpy(y, tmp_path / "b.zarr", tile=(TILE, TILE))
    return x, y, a, b


def _not_complete(path):
    with pytest.raises(ta.IncompleteOutputError):
        ta.open(path)
    assert not is_complete(ArrayRef.from_location(path))


def _delete_chunks(path):
    shutil.rmtree(os.path.join(path, "c"))  # its zarr.json and done markers kept


def _overwrite(path):
    ta.from_numpy(np.ones((N, N)), path, tile=(TILE, TILE), overwrite=True)


def _delete(path):
    shutil.rmtree(path)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("after", [1, 6, 13])
@pytest.mark.parametrize("change", [_delete_chunks, _overwrite, _delete],
                         ids=["chunks-deleted", "overwritten", "deleted"])
def test_input_changed_mid_run_fails_naming_it(thread_engine, tmp_path, rng, change, after):
    x, y, a, b = _inputs(tmp_path, rng)
    out = str(tmp_path / "c.zarr")
    name, after = _gate(f"{change.__name__}-{after}", after)
    store = GateStore(LocalStore(out), name, after)
    result = {}

    def job():
        try:
            (a @ b).to_zarr(store, tile=(TILE, TILE), engine=thread_engine)
            result["ok"] = True
        except Exception as e:  # judged below
            result["error"] = e

    t = threading.Thread(target=job)
    t.start()
    assert _gates[name]["reached"].wait(120), "the job never wrote a done marker"
    change(str(tmp_path / "b.zarr"))  # the job holds at its `after`-th done marker
    _gates[name]["release"].set()
    t.join(120)
    err = result.get("error")
    assert isinstance(err, ta.StorageError), result
    assert str(tmp_path / "b.zarr") in str(err), err
    assert not isinstance(err, FileNotFoundError) or isinstance(err, ta.TilearrayError)
    _not_complete(out)
    assert not os.path.exists(out + ".tilearray.lock")  # the job let go of its lock


class Killed(Exception):
    """Stands for the kill of a job's process."""


class NoCommitStore(WrapperStore):
    """Refuses the write that marks the output complete: what a job killed
    after its last unit, before its commit, leaves (every unit done, not
    complete)."""

    def __reduce__(self):
        return (type(self), (self._store,))

    def _with_store(self, store):
        return type(self)(store)

    def __eq__(self, other):
        return type(self) is type(other) and self._store == other._store

    async def set(self, key, value):
        if key.endswith("zarr.json"):
            import json

            attrs = json.loads(value.to_bytes()).get("attributes", {})
            if attrs.get("tilearray", {}).get("complete") is True:
                raise Killed("killed before the commit")
        await self._store.set(key, value)


def _open_error(path):
    with pytest.raises(ta.IncompleteOutputError) as e:
        ta.open(path)
    return str(e.value)


@pytest.mark.timeout(180)
def test_output_of_a_job_whose_input_changed_mid_run_says_overwrite(thread_engine, tmp_path,
                                                                     rng):
    """Issue 28: after a job fails because an input was overwritten while it
    ran (every unit written, never marked complete), opening its output said
    "0 of 16 I/O units were never written ... rerun with resume=True", and
    that resume was then refused. It says what happened and that a rerun
    with overwrite=True is what is accepted."""
    x, y, a, b = _inputs(tmp_path, rng)
    out = str(tmp_path / "c.zarr")
    units = (N // TILE) ** 2
    name, after = _gate("overwritten-at-last-unit", units)
    store = GateStore(LocalStore(out), name, after)
    result = {}

    def job():
        try:
            (a @ b).to_zarr(store, tile=(TILE, TILE), engine=thread_engine)
        except Exception as e:
            result["error"] = e

    t = threading.Thread(target=job)
    t.start()
    assert _gates[name]["reached"].wait(120), "the job never wrote its last done marker"
    _overwrite(str(tmp_path / "b.zarr"))
    _gates[name]["release"].set()
    t.join(120)
    assert "was modified" in str(result.get("error")), result
    msg = _open_error(out)
    b_path = str(tmp_path / "b.zarr")
    assert msg == (
        f"{out!r} is an incomplete tilearray output: all {units} I/O units were written, but "
        "the job stopped before marking it complete (its inputs changed). Its input "
        f"{b_path!r} was modified since the job started, so a resume would be refused: rerun "
        "the expression with overwrite=True to compute it again, or open it with "
        "allow_incomplete=True to inspect it.")
    assert "never written" not in msg and "resume=True" not in msg
    b2 = ta.open(b_path)
    with pytest.raises(ta.StorageError, match="cannot resume"):  # the advice was right
        (a @ b2).to_zarr(out, resume=True, engine=thread_engine)
    c = (a @ b2).to_zarr(out, overwrite=True, engine=thread_engine)  # as advised
    assert_close(c.compute(engine=thread_engine), x @ np.ones((N, N)))


@pytest.mark.timeout(180)
def test_output_of_a_job_whose_input_was_deleted_mid_run_says_overwrite(thread_engine,
                                                                        tmp_path, rng):
    """Units left unwritten by a job whose input was deleted: not "resume"."""
    x, y, a, b = _inputs(tmp_path, rng)
    out = str(tmp_path / "c.zarr")
    name, after = _gate("deleted-at-first-unit", 1)
    store = GateStore(LocalStore(out), name, after)
    result = {}

    def job():
        try:
            (a + b).to_zarr(store, tile=(TILE, TILE), engine=thread_engine)
        except Exception as e:
            result["error"] = e

    t = threading.Thread(target=job)
    t.start()
    assert _gates[name]["reached"].wait(120), "the job never wrote a done marker"
    _delete(str(tmp_path / "b.zarr"))
    _gates[name]["release"].set()
    t.join(120)
    assert isinstance(result.get("error"), ta.StorageError), result
    msg = _open_error(out)  # (its tasks may have read b before it went: all units done)
    assert (f"Its input {str(tmp_path / 'b.zarr')!r} was deleted since the job started, so a "
            "resume would be refused: rerun the expression with overwrite=True") in msg, msg
    assert "resume=True" not in msg


@pytest.mark.timeout(180)
def test_output_of_a_job_killed_before_its_commit_says_resume_and_resumes(thread_engine,
                                                                          tmp_path, rng):
    """Issue 28: a job killed after its last unit, before marking its output
    complete, left "0 of 16 I/O units were never written". It says all units
    were written and that resume=True marks it complete -- which it does,
    recomputing nothing; once an input changes, it says overwrite=True."""
    x, y, a, b = _inputs(tmp_path, rng)
    out = str(tmp_path / "c.zarr")
    units = (N // TILE) ** 2
    with pytest.raises(Killed):
        (a @ b).to_zarr(NoCommitStore(LocalStore(out)), tile=(TILE, TILE),
                        engine=thread_engine)
    assert len(os.listdir(os.path.join(out, "tilearray.done"))) == units
    msg = _open_error(out)
    assert msg == (
        f"{out!r} is an incomplete tilearray output: all {units} I/O units were written, but "
        "the job stopped before marking it complete (it was killed or failed before its "
        "commit). Rerun the same expression with to_zarr(..., resume=True) to mark it "
        "complete (nothing is recomputed), or open it with allow_incomplete=True to inspect it.")
    c = (a @ b).to_zarr(out, resume=True, engine=thread_engine)  # as advised: accepted
    assert c.stats.skipped_units == units and c.stats.tasks == 0
    assert_close(ta.open(out).compute(engine=thread_engine), x @ y)

    # the same leftover, then an input changes: resume would be refused, so not advised
    out2 = str(tmp_path / "d.zarr")
    with pytest.raises(Killed):
        (a @ b).to_zarr(NoCommitStore(LocalStore(out2)), tile=(TILE, TILE),
                        engine=thread_engine)
    _overwrite(str(tmp_path / "a.zarr"))
    msg = _open_error(out2)
    assert "(its inputs changed)" in msg and "overwrite=True" in msg, msg
    assert f"Its input {str(tmp_path / 'a.zarr')!r} was modified" in msg, msg
    assert "resume=True" not in msg
    with pytest.raises(ta.StorageError, match="cannot resume"):
        (ta.open(tmp_path / "a.zarr") @ b).to_zarr(out2, resume=True, engine=thread_engine)


_reads: dict = {}


class OverwrittenWhileReadStore(WrapperStore):
    """An input another job overwrites while it is read: at its ``after``-th
    chunk read, the chunk files of ``source`` replace its own (plain file
    copies, as a writer's would land). A process-global counter: use an
    in-process engine."""

    def __init__(self, store, source, after, name="reads"):
        super().__init__(store)
        self.source, self.after, self.name = source, after, name

    @property
    def root(self):  # a local directory: its files' state is what is checked
        return self._store.root

    def __reduce__(self):
        return (type(self), (self._store, self.source, self.after, self.name))

    def _with_store(self, store):
        return type(self)(store, self.source, self.after, self.name)

    def __eq__(self, other):
        return type(self) is type(other) and self.name == other.name \
            and self._store == other._store

    async def get(self, key, prototype, byte_range=None):
        if key.startswith("c/"):
            with _reads[self.name]["lock"]:
                _reads[self.name]["count"] += 1
                if _reads[self.name]["count"] == self.after:
                    shutil.copytree(os.path.join(self.source, "c"),
                                    os.path.join(str(self._store.root), "c"),
                                    dirs_exist_ok=True, copy_function=shutil.copyfile)
        return await self._store.get(key, prototype, byte_range)


@pytest.mark.timeout(120)
def test_compute_of_input_overwritten_while_read_is_refused(thread_engine, tmp_path, rng):
    """compute() (np.asarray, reduce without -o) reading an input that another
    job overwrites meanwhile fails naming it -- it returned a silent mix of old
    and new tiles (found with a reader looping over np.asarray while
    `tilearray random --overwrite` replaced its input)."""
    from tilearray.engine.expr.nodes import Source

    x = rng.standard_normal((N, N))
    b = ta.from_numpy(x, tmp_path / "b.zarr", tile=(TILE, TILE))
    ta.from_numpy(np.ones((N, N)), tmp_path / "new.zarr", tile=(TILE, TILE))
    _reads["mid"] = {"lock": threading.Lock(), "count": 0}
    store = OverwrittenWhileReadStore(LocalStore(str(tmp_path / "b.zarr")),
                                      str(tmp_path / "new.zarr"), after=5, name="mid")
    wrapped = ta.TiledArray(Source(b.shape, b.dtype, ArrayRef(store), b.grid))
    with pytest.raises(ta.StorageError, match="modified while compute"):
        (wrapped * 1.0).compute(engine=thread_engine)
    assert _reads["mid"]["count"] >= 5  # the overwrite happened mid-read
    assert_close((b * 1.0).compute(engine=thread_engine), np.ones((N, N)))  # now stable


@pytest.mark.timeout(120)
def test_missing_chunk_of_complete_output_is_an_error(engine, tmp_path, rng):
    x, y, a, b = _inputs(tmp_path, rng)
    os.unlink(tmp_path / "b.zarr" / "c" / "1" / "2")
    with pytest.raises(ta.CorruptChunkError, match=r"b\.zarr.*tile index \(1, 2\).*missing"):
        b.sum().compute()
    out = tmp_path / "c.zarr"
    with pytest.raises(ta.CorruptChunkError, match=r"b\.zarr.*\(1, 2\)"):
        (a @ b).to_zarr(out)
    _not_complete(out)


def test_corrupt_chunk_is_reported_once(thread_engine, tmp_path, rng, caplog):
    """A corrupt chunk fails the job with the CorruptChunkError alone: no
    worker "Compute Failed" record and traceback beside it (helper-44)."""
    x = rng.standard_normal((N, N))
    b = ta.from_numpy(x, tmp_path / "b.zarr", tile=(TILE, TILE))
    path = tmp_path / "b.zarr" / "c" / "1" / "0"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ta.CorruptChunkError, match=r"b\.zarr.*tile index \(1, 0\)"):
        b.sum(axis=0).compute(engine=thread_engine)
    assert "Compute Failed" not in caplog.text


@pytest.mark.timeout(120)
def test_missing_shard_of_complete_output_names_its_first_tile(engine, tmp_path, rng):
    x = rng.standard_normal((32, 32))
    ta.from_numpy(x, tmp_path / "s.zarr", tile=(8, 8), shard=(16, 16))
    os.unlink(tmp_path / "s.zarr" / "c" / "1" / "0")
    with pytest.raises(ta.CorruptChunkError, match=r"tile index \(2, 0\)"):
        ta.open(tmp_path / "s.zarr").sum(axis=0).compute()


@pytest.mark.timeout(120)
def test_all_zero_units_are_stored_and_read_back(engine, tmp_path):
    """Zero tiles are written too (else a missing chunk could not be told from one)."""
    x = np.zeros((32, 32))
    x[:8, :8] = 1
    a = ta.from_numpy(x, tmp_path / "z.zarr", tile=(8, 8))
    assert len(os.listdir(tmp_path / "z.zarr" / "c" / "3")) == 4
    c = (a * 2).to_zarr(tmp_path / "z2.zarr")
    assert len(os.listdir(tmp_path / "z2.zarr" / "c" / "3")) == 4
    assert_close(c.compute(), 2 * x)


@pytest.mark.timeout(120)
def test_missing_chunk_of_foreign_array_is_the_fill_value(engine, tmp_path, rng):
    x = rng.standard_normal((32, 32))
    z = zarr.create_array(str(tmp_path / "f.zarr"), shape=x.shape, chunks=(8, 8),
                          dtype="f8", fill_value=0)
    z[...] = x
    os.unlink(tmp_path / "f.zarr" / "c" / "0" / "0")
    want = x.copy()
    want[:8, :8] = 0
    assert_close(ta.open(tmp_path / "f.zarr").sum(axis=0).compute(), want.sum(axis=0))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shard", [None, (16, 16)])
def test_zarr_copy_of_an_output_reads_unstored_chunks_as_fill(engine, tmp_path, rng, shard):
    """Copied with plain zarr, an output keeps its attributes (``complete``,
    format 2) but not its done markers, and zarr does not store its all-zero
    chunks: they read as the fill value, as zarr and xarray read them (it
    was a CorruptChunkError, 'data deleted or lost')."""
    x = rng.standard_normal((32, 48))
    x[:16, :16] = 0.0
    ta.from_numpy(x, tmp_path / "out.zarr", tile=(8, 8), shard=shard)
    src = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
    dst = zarr.create_array(str(tmp_path / "copy.zarr"), shape=src.shape, chunks=src.chunks,
                            shards=src.shards, dtype=src.dtype, fill_value=0,
                            attributes=dict(src.attrs))
    dst[...] = src[...]
    assert not os.path.exists(tmp_path / "copy.zarr" / "c" / "0" / "0")
    c = ta.open(tmp_path / "copy.zarr")
    assert_close(c.sum(axis=0).compute(), x.sum(axis=0))
    assert_close((c.T @ c).compute(), x.T @ x)


# -- targets ----------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_output_symlinked_to_an_input_refused(engine, tmp_path, rng):
    x, y, a, b = _inputs(tmp_path, rng)
    os.symlink(tmp_path / "b.zarr", tmp_path / "link.zarr")
    (tmp_path / "d").mkdir()
    os.symlink(tmp_path, tmp_path / "d" / "up")  # a parent that is a link
    before = sorted(os.listdir(tmp_path / "b.zarr" / "c" / "0"))
    for target in (tmp_path / "link.zarr", tmp_path / "d" / "up" / "b.zarr"):
        with pytest.raises(ta.StorageError, match="holds an input") as e:
            (a @ b).to_zarr(target, overwrite=True)
        assert str(target) in str(e.value) and str(tmp_path / "b.zarr") in str(e.value)
    assert_close(ta.open(tmp_path / "b.zarr").compute(), y)  # intact
    assert sorted(os.listdir(tmp_path / "b.zarr" / "c" / "0")) == before
    assert not os.path.exists(str(tmp_path / "link.zarr") + ".tilearray.lock")


@pytest.mark.timeout(120)
def test_output_that_is_a_symlink_refused(engine, tmp_path, rng):
    x, y, a, b = _inputs(tmp_path, rng)
    (a + 1).to_zarr(tmp_path / "real.zarr")
    os.symlink(tmp_path / "real.zarr", tmp_path / "alias.zarr")
    with pytest.raises(ta.StorageError, match="symbolic link") as e:
        (a * 2).to_zarr(tmp_path / "alias.zarr", overwrite=True)
    assert str(tmp_path / "alias.zarr") in str(e.value)
    assert_close(ta.open(tmp_path / "real.zarr").compute(), x + 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("overwrite", [False, True])
def test_target_that_is_a_regular_file_refused(engine, tmp_path, rng, overwrite):
    x, y, a, b = _inputs(tmp_path, rng)
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    for expr in (a + b, (a + b).sum(axis=0)):
        with pytest.raises(ta.StorageError, match="regular file, not a Zarr array") as e:
            expr.to_zarr(f, overwrite=overwrite)
        assert str(f) in str(e.value) and "already exists" not in str(e.value)
    assert f.read_text() == "keep me"
    assert not os.path.exists(str(f) + ".tilearray.lock")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("overwrite", [False, True])
def test_target_that_is_a_dangling_symlink_is_called_one(engine, tmp_path, rng, overwrite):
    """Issue 28: a dangling symbolic link at the target was called "a regular file"."""
    x, y, a, b = _inputs(tmp_path, rng)
    link = tmp_path / "gone.zarr"
    os.symlink(tmp_path / "missing.zarr", link)
    said = (f"{str(link)!r} is a symbolic link to a missing target "
            f"({str(tmp_path / 'missing.zarr')!r}), not a Zarr array; tilearray does not "
            "replace a link (also with overwrite=True) — write to its target's path itself, "
            "or remove the link")
    for write in (lambda: (a + b).to_zarr(link, overwrite=overwrite),
                  lambda: (a + b).sum(axis=0).to_zarr(link, overwrite=overwrite),
                  lambda: ta.from_numpy(x, link, overwrite=overwrite)):
        with pytest.raises(ta.StorageError) as e:
            write()
        assert str(e.value) == said
    with pytest.raises(ta.StorageError) as e:
        ta.open(link)
    assert str(e.value) == (f"no Zarr array at {str(link)!r}: it is a symbolic link to a "
                            f"missing target ({str(tmp_path / 'missing.zarr')!r})")
    assert os.path.islink(link) and not os.path.exists(tmp_path / "missing.zarr")


@pytest.mark.timeout(120)
def test_output_in_a_read_only_directory_is_a_public_storage_error(engine, tmp_path, rng,
                                                                    monkeypatch):
    """Issue 28: a read-only directory's error was the private class
    ``_CannotCreate``; it is a StorageError naming the output and the
    directory that is not writable. (As root, permissions are not enforced:
    the directory then refuses writes through a patched ``open``.)"""
    import builtins

    import tilearray.storage.locks as locks

    x, y, a, b = _inputs(tmp_path, rng)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:
        real = builtins.open

        def deny(file, mode="r", *args, **kwargs):
            if str(file).startswith(str(ro) + os.sep) and set(mode) & set("wax+"):
                raise PermissionError(13, "Permission denied", str(file))
            return real(file, mode, *args, **kwargs)

        monkeypatch.setattr(locks, "open", deny, raising=False)
    try:
        for expr in (a + b, (a + b).sum(axis=0)):
            with pytest.raises(ta.StorageError) as e:
                expr.to_zarr(ro / "c.zarr")
            assert type(e.value) is ta.StorageError
            assert str(e.value).startswith(
                f"cannot write {str(ro / 'c.zarr')!r}: the directory {str(ro)!r} is not "
                "writable (PermissionError: [Errno 13] Permission denied: "), str(e.value)
            assert str(e.value).endswith("); write to a location this process can write to")
            assert "_CannotCreate" not in str(e.value)
        assert os.listdir(ro) == []
    finally:
        ro.chmod(0o755)

