"""An experiment folder by local path or URI (s3://, gs://, ...), through pyarrow's file systems.

Ray Tune writes a search kept in cloud storage with pyarrow (`augtune search --storage s3://...`), and a
trial uploads its own folder here (`trainables.ray_trainable.TrialFolder`); the search layer, `augtune
resume`, `status` and `export` read and write it here, with the same file systems. Credentials
and endpoints come from the environment that Ray's own processes read too (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL for an S3-compatible server;
GOOGLE_APPLICATION_CREDENTIALS for gs://), never from the URI: augtune joins experiment and trial
names onto the location as paths, which a query string (`?endpoint_override=...`) would end up
inside of, so a URI with one is refused with one line.

`local_copy` downloads what the analysis and status need (records, configs, the search's own files;
never checkpoints nor Tune's state) into a temporary folder, so that
`augtune.analysis` keeps reading local folders only. `UploadedJournal` keeps Optuna's journal of a
search kept in cloud storage in a local file, uploaded beside the experiment after every write.
"""
from __future__ import annotations

import contextlib
import fnmatch
import re
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional

from augtune import scratch
from augtune.records import (
    COMPARE_FILE, CONFIG_FILE, RECORD_FILE, SEARCH_FILE, atomic_file, is_uri, write_atomic,
)

# What `status`, `export` and `importance` read of an experiment: basenames, at any depth
RECORD_PATTERNS = (SEARCH_FILE, COMPARE_FILE, RECORD_FILE, CONFIG_FILE)
SKIPPED_DIRS = ("checkpoint_*",)  # Tune's and Train's checkpoint folders: the bulk of an experiment


class StorageError(ValueError):
    """A location that cannot be used or read; the message is one line naming it."""


def argument(value: object) -> str:
    """A location given on the command line, as the user typed it. argparse's `type=Path` folds a URI's
    `//` (`Path("s3://b/x")` is `s3:/b/x`): a first part `<scheme>:` that pyarrow knows gets it back."""
    text = str(value)
    m = re.match(r"^(s3|gs|gcs|hdfs|viewfs|abfs|abfss):/(?!/)", text)
    return f"{m.group(1)}://{text[m.end():]}" if m else text


def filesystem(location: str):
    """(pyarrow file system, path on it) of a local folder or a URI; StorageError for a bad URI."""
    import pyarrow.fs

    if not is_uri(location):
        return pyarrow.fs.LocalFileSystem(), str(Path(location).expanduser().resolve())
    if "?" in location:
        raise StorageError(f"{location}: options in the URI's query are not supported; set them in the "
                           "environment instead (e.g. AWS_ENDPOINT_URL=http://host:port for an S3-compatible "
                           "server), on the driver and on every node")
    try:
        fs, path = pyarrow.fs.FileSystem.from_uri(location)
    except Exception as e:  # pyarrow raises several types; the message is what matters
        raise StorageError(f"{location}: {str(e).splitlines()[0]}") from None
    return fs, path.rstrip("/")


def split(location: str) -> tuple[str, str]:
    """(parent, name) of an experiment's location: `s3://b/searches/exp` -> (`s3://b/searches`, `exp`)."""
    if not is_uri(location):
        path = Path(location).expanduser().resolve()
        return str(path.parent), path.name
    parent, _, name = location.rstrip("/").rpartition("/")
    if not name or parent.endswith(":/"):  # `s3://bucket`: a bucket is no experiment folder
        raise StorageError(f"{location}: name the experiment's folder (<storage>/<name>), not a bucket")
    return parent, name


def _info(fs, path: str):

    try:
        return fs.get_file_info(path)
    except OSError as e:
        raise StorageError(f"{path}: cannot be read ({str(e).splitlines()[0][:160]})") from None


def exists(location: str, name: str = "") -> bool:
    import pyarrow.fs

    fs, path = filesystem(location)
    return _info(fs, f"{path}/{name}" if name else path).type != pyarrow.fs.FileType.NotFound


def read_text(location: str, name: str) -> Optional[str]:
    """The text of file `name` in the folder at `location`, or None when there is none."""
    data = read_bytes(location, name)
    return None if data is None else data.decode("utf-8", errors="replace")


def read_bytes(location: str, name: str) -> Optional[bytes]:
    """The bytes of file `name` (a relative path) in the folder at `location`, or None when there is none."""
    import pyarrow.fs

    fs, path = filesystem(location)
    if _info(fs, f"{path}/{name}").type != pyarrow.fs.FileType.File:
        return None
    with fs.open_input_stream(f"{path}/{name}") as f:
        return f.read()


def read_tail(location: str, name: str, size: int) -> Optional[bytes]:
    """The last `size` bytes of file `name` in the folder at `location` (all of a shorter one), or None when
    there is none: what a large file ends with, without reading it whole."""
    import pyarrow.fs

    fs, path = filesystem(location)
    info = _info(fs, f"{path}/{name}")
    if info.type != pyarrow.fs.FileType.File:
        return None
    with fs.open_input_file(f"{path}/{name}") as f:
        f.seek(max(0, info.size - size))
        return f.read()


def write_bytes(location: str, name: str, data: bytes) -> str:
    """Replace file `name` (a relative path) in the folder at `location` with `data`, whole: through a
    temporary file and a rename in a local folder, never through a link (`records.write_atomic`; an
    object store writes whole objects); its path."""
    import pyarrow.fs

    fs, path = filesystem(location)
    target = f"{path}/{name}"
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        local = Path(target)
        local.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(local, data)
        return target
    fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(target) as f:
        f.write(data)
    return target


def names(location: str) -> list[str]:
    """The names directly in the folder at `location` (files and folders), [] when it does not exist."""
    import pyarrow.fs

    fs, path = filesystem(location)
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    except OSError as e:
        raise StorageError(f"{location}: cannot be listed ({str(e).splitlines()[0][:160]})") from None
    return sorted(i.base_name for i in infos)


def delete(location: str, name: str) -> None:
    fs, path = filesystem(location)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(f"{path}/{name}")


def upload(local: Path, location: str, name: str) -> None:
    """Copy the local file or folder `local` to `name` in the folder at `location` (replacing it)."""
    import pyarrow.fs

    fs, path = filesystem(location)
    pyarrow.fs.copy_files(str(local), f"{path}/{name}", source_filesystem=pyarrow.fs.LocalFileSystem(),
                          destination_filesystem=fs)


def download(location: str, dest: Path, keep: Callable[[str], bool] = lambda rel: True) -> list[str]:
    """Copy the files under `location` whose relative path passes `keep` into the folder `dest`, skipping
    checkpoint folders; the relative paths copied."""
    import pyarrow.fs

    fs, root = filesystem(location)
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError as e:
        raise StorageError(f"{location}: cannot be listed ({str(e).splitlines()[0][:160]})") from None
    copied = []
    for info in infos:
        rel = info.path[len(root):].lstrip("/")
        parts = rel.split("/")
        if (info.type != pyarrow.fs.FileType.File or not keep(rel)
                or any(fnmatch.fnmatch(p, pat) for p in parts[:-1] for pat in SKIPPED_DIRS)):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with fs.open_input_stream(info.path) as src, atomic_file(target) as out:
            shutil.copyfileobj(src, out)
        copied.append(rel)
    return copied


def is_record_file(rel: str) -> bool:
    """What `status`, `export` and `importance` read (RECORD_PATTERNS), wherever it is."""
    base = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(base, pat) for pat in RECORD_PATTERNS)


@contextlib.contextmanager
def local_copy(location: str) -> Iterator[Path]:
    """A local folder holding the experiment at `location`: the folder itself when it is local, else a
    temporary copy of its records (`is_record_file`, no checkpoints) named as the experiment, removed
    on exit."""
    if not is_uri(location):
        yield Path(location).expanduser()
        return
    _, name = split(location)
    if not exists(location):
        raise StorageError(f"{location}: no such experiment")
    with scratch.temporary("copy-") as tmp:
        dest = Path(tmp) / name  # the experiment's own name: tables and labels read it from the folder
        dest.mkdir()
        download(location, dest, is_record_file)
        yield dest


# -- Optuna's study of a search kept in cloud storage ---------------------------------------------------

_LOCAL_JOURNALS: dict[str, Path] = {}  # URI -> this process's local copy (every instance shares it)
_JOURNALS_LOCK = threading.Lock()


class UploadedJournal:
    """Optuna's journal backend (`optuna.storages.journal.BaseJournalBackend`: `read_logs`, `append_logs`)
    for a file kept at `uri`: a local journal file (Optuna's `JournalFileBackend`, with its lock) that is
    uploaded to `uri` after every append, so that the copy in storage is never behind the trials' records
    beside it. Made on another machine (`augtune resume s3://...`), it downloads the journal and continues
    the same study. Every instance in one process shares one local file, so copies (Tune pickles the
    searcher into its own state, which augtune never reads) cannot diverge."""

    def __init__(self, uri: str):
        from optuna.storages.journal import JournalFileBackend

        self.uri = uri
        self._parent, self._name = split(uri)
        with _JOURNALS_LOCK:
            local = _LOCAL_JOURNALS.get(uri)
            if local is None or not local.exists():
                local = scratch.scratch_dir("optuna-") / self._name
                text = read_text(self._parent, self._name)
                write_atomic(local, text or "")
                _LOCAL_JOURNALS[uri] = local
        self.local = local
        self._file = JournalFileBackend(str(local))

    def __reduce__(self):
        return UploadedJournal, (self.uri,)

    def read_logs(self, log_number_from: int):
        return self._file.read_logs(log_number_from)

    def append_logs(self, logs: list) -> None:
        self._file.append_logs(logs)
        upload(self.local, self._parent, self._name)
