"""Concurrent writers of different members of one group never lose a member
from the group's consolidated metadata (the listing xarray reads)."""

import asyncio
import multiprocessing as mp
import warnings

import pytest
import zarr
from zarr.storage import LocalStore, WrapperStore

from tilearray.storage import ArrayRef, create, mark_complete
from tilearray.storage.array import mark_unit_done

MEMBERS = 4


class SlowListingStore(WrapperStore):
    """Delays writes of the group's own ``zarr.json`` (where the consolidated
    listing lives), widening the window between a refresh's reads and its
    write: without serialisation, a refresh that read a member as unfinished
    then overwrites a newer listing that has it."""

    def _with_store(self, store):
        return type(self)(store)

    async def set(self, key, value):
        if key == "zarr.json":
            await asyncio.sleep(0.02)
        await self._store.set(key, value)


def _finish_member(g, name, barrier):
    warnings.simplefilter("ignore")
    store = SlowListingStore(LocalStore(g))
    create(store, (2, 2), "f8", (2, 2), path=name)  # incomplete: left out of the listing
    ref = ArrayRef(store, name)
    mark_unit_done(ref, 0, 0)
    barrier.wait()
    mark_complete(ref)  # all members complete at once, each refreshing the listing


@pytest.mark.timeout(180)
def test_concurrent_member_commits_keep_every_member_listed(tmp_path):
    ctx = mp.get_context("fork")  # the test module is not importable by name in a child
    for trial in range(8):
        g = str(tmp_path / f"g{trial}.zarr")
        zarr.open_group(g, mode="w", zarr_format=3)
        barrier = ctx.Barrier(MEMBERS)
        ps = [ctx.Process(target=_finish_member, args=(g, f"m{i}", barrier))
              for i in range(MEMBERS)]
        for p in ps:
            p.start()
        for p in ps:
            p.join(60)
            assert p.exitcode == 0
        group = zarr.open_group(g, mode="r", use_consolidated=True)
        listed = set(group.metadata.consolidated_metadata.metadata)
        assert listed == {f"m{i}" for i in range(MEMBERS)}, (trial, sorted(listed))
