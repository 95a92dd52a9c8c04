"""Staged shuffles: the blocks a stage sends through a ``GroupByKey`` written to files,
and only references to them shuffled.

Some runners hold a shuffle's data in worker memory: the DirectRunner keeps a
``GroupByKey``'s input in its process, and Beam's Dask runner keeps every
``ParDo`` task's outputs alive until the shuffle that reads them is done, out of
reach of Dask's spilling (``docs/runners.md``). There, a worker's memory grows
with the input. A stage given a ``Staging`` writes the blocks it would emit
(``(key, bytes)``) to ONE new file per element it processes and emits
``(key, BlockRef)`` instead, a few dozen bytes; the stage after the shuffle reads
the blocks back (``Staging.read``). A worker then holds one element's refs and
one group's blocks, whatever the size of the input.

Each writer makes a file of its own (a random name), written whole and closed
before any reference to it is emitted: an object store shows a file only once
it is closed, and a retried attempt never appends to, or reads from, another
attempt's file. A writer that fails deletes its file. Files of attempts the
runner dropped (a killed worker's) stay until the directory is removed.

The files hold private data derived from the input (the presampled pairs,
unnoised partial histograms): the directory must be as private as the input,
on a filesystem every worker reads and writes, and removed when the run ends.
``make_directory`` makes it owner-only on a local disk; the command line puts
it next to the release (``beam-temp-NAME.PRIVATE-staging-<hex>``) and removes it
after the run, failed or not. Nothing about the run key is written.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid
from typing import Iterable, List, NamedTuple, Sequence, Tuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

__all__ = ["Staging", "BlockRef", "make_directory", "remove_directory"]

#: The suffix of a staged file (Arrow IPC messages, one after the other).
SUFFIX = ".blocks"


class BlockRef(NamedTuple):
    """Where one staged block is: its file's name in the staging directory, its
    offset and its length in bytes."""
    name: str
    offset: int
    length: int


def _is_local(path: str) -> bool:
    return "://" not in path


def make_directory(path: str) -> str:
    """Creates the staging directory ``path`` (owner-only, mode 0700, on a local disk;
    an object store has no directories, and its access control applies) and returns
    it. The directory must not exist yet: a staging directory is one run's."""
    if _is_local(path):
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # whatever the umask
    else:
        FileSystems.mkdirs(path)
    return path


def remove_directory(path: str, attempts: int = 5) -> bool:
    """Removes the staging directory ``path`` and every file in it; whether it is gone.

    A task still running when the run ended may add a file while the directory is
    removed, so the removal is tried ``attempts`` times, a tenth of a second apart.
    On an object store, every object under ``path/`` is deleted."""
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.1)
        if _is_local(path):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                return True
            continue
        prefix = path.rstrip("/") + "/"
        try:
            found = [m.path for r in FileSystems.match([prefix + "**"]) for m in r.metadata_list]
            if not found:
                return True
            FileSystems.delete(found)
        except Exception:  # gone meanwhile, or a transient error: look again
            pass
    return False


class Staging:
    """A staging directory (picklable: it travels with the DoFns that use it).

    Args:
      directory: a directory every worker can read and write (local path, or any
        Beam filesystem's), already created (``make_directory``; a local one is
        checked here, where the transform is built) and private to the run's
        owner; the caller removes it after the run.
    """

    def __init__(self, directory: str):
        if not isinstance(directory, str) or not directory:
            raise ValueError(f"the staging directory must be a non-empty path, got "
                             f"{directory!r}")
        if _is_local(directory) and not os.path.isdir(directory):
            raise ValueError(f"the staging directory must be an existing directory, got "
                             f"{directory!r}")
        self.directory = directory

    def __repr__(self):
        return f"Staging({self.directory!r})"

    def writer(self) -> "StagedWriter":
        """A writer of one new file in the directory."""
        return StagedWriter(self.directory)

    def read(self, refs: Iterable[BlockRef]) -> List[bytes]:
        """The blocks of ``refs``, in their order (each file opened once)."""
        refs = [BlockRef(*r) for r in refs]
        by_file = {}
        for i, ref in enumerate(refs):
            by_file.setdefault(ref.name, []).append(i)
        out: List[bytes] = [b""] * len(refs)
        for name, where in by_file.items():
            path = FileSystems.join(self.directory, name)
            with (open(path, "rb") if _is_local(path) else FileSystems.open(
                    path, compression_type=CompressionTypes.UNCOMPRESSED)) as f:
                for i in sorted(where, key=lambda k: refs[k].offset):
                    f.seek(refs[i].offset)
                    blob = f.read(refs[i].length)
                    if len(blob) != refs[i].length:
                        raise IOError(f"staged file {path} ends before byte "
                                      f"{refs[i].offset + refs[i].length}")
                    out[i] = blob
        return out


class StagedWriter:
    """One new staged file: ``add(key, blob)`` writes a block, and the context's end
    closes the file; ``refs`` then holds ``(key, BlockRef)`` of every block, in
    order. When the context ends with an exception the file is deleted and no
    reference is given."""

    def __init__(self, directory: str):
        self.name = f"{uuid.uuid4().hex}{SUFFIX}"
        self._path = FileSystems.join(directory, self.name)
        self._file = None
        self._offset = 0
        self._refs: List[Tuple[object, BlockRef]] = []
        self.refs: List[Tuple[object, BlockRef]] = []

    def __enter__(self):
        if _is_local(self._path):
            # owner-only, new, and never a directory made again: when the directory is
            # gone (the run ended and removed it while a task still ran), this fails
            # instead of leaving private data in a directory nobody removes
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            self._file = os.fdopen(fd, "wb")
        else:
            self._file = FileSystems.create(self._path, mime_type="application/octet-stream",
                                            compression_type=CompressionTypes.UNCOMPRESSED)
        return self

    def add(self, key, blob: bytes) -> None:
        self._file.write(blob)
        self._refs.append((key, BlockRef(self.name, self._offset, len(blob))))
        self._offset += len(blob)

    def __exit__(self, kind, value, traceback):
        try:
            self._file.close()
        except BaseException:
            if kind is None:
                self._delete()
                raise
        if kind is not None:
            self._delete()
            return False
        self.refs = self._refs
        return False

    def _delete(self) -> None:
        try:
            if _is_local(self._path):
                os.remove(self._path)
            else:
                FileSystems.delete([self._path])
        except Exception:  # already gone, or never made: the directory's removal ends it
            pass


def staged(staging, pairs: Sequence[Tuple[object, bytes]]):
    """``(key, bytes)`` pairs as they cross a shuffle: unchanged without ``staging``,
    else written to one new file, as ``(key, BlockRef)``."""
    if staging is None:
        return list(pairs)
    with staging.writer() as w:
        for key, blob in pairs:
            w.add(key, blob)
    return w.refs


def unstaged(staging, values) -> List[bytes]:
    """A shuffle's grouped values back as blocks: unchanged without ``staging``, else
    read from the staged files."""
    return list(values) if staging is None else staging.read(values)
