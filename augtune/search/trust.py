"""Signed state: `augtune resume` unpickles only what this user's augtune wrote.

Resuming a search loads Tune's and the searchers' state, which are pickles (`tuner.pkl`, the searchers'
`*-state-*.pkl`, Tune's variant and search generators' `basic-variant-state-*.json` and
`search_gen_state-*.json`, its callbacks' `callback-states-*.pkl`, the cloudpickled fields of
`experiment_state-*.json`: `STATE_PATTERNS`): whoever wrote them can run code
in `augtune resume`. A folder copied from a colleague or read from a shared bucket must not be trusted
for arriving. So every such file augtune writes is signed with a key of the user's own (HMAC-SHA256; the
key is made on first use, `$XDG_CONFIG_HOME/augtune/state.key`, mode 600 — the pattern Jupyter uses to
trust notebooks), and `resume` refuses, before anything is unpickled, a state file whose signature is
missing or made with another key, unless the user says `--trust`.

Signatures live in two places, each enough on its own: `augtune_state.sig` (and `augtune_tuner.sig`
for `tuner.pkl`, which Tune writes elsewhere and at other times) beside the files in the experiment
folder (they travel with it: the same user on another machine with the same key), and a ledger in
the user's config folder (`signed.log`: every signature this user's augtune made). Tune
writes its state, then copies it to the experiment folder file by file; a driver killed in between
leaves a folder whose signature file is older than a state file, which the ledger still vouches for.
Tune copies in the background and would save again while a copy may still run; augtune lets it save
only when no copy is in flight (`adapters.hold_copies_while_saving`), so no copy carries a state
file written but not yet signed.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import secrets
from fnmatch import fnmatch
from pathlib import Path
from typing import Iterable

from augtune.config import ConfigError

SIGNATURES = "augtune_state.sig"  # written beside Tune's state where Tune writes it (then copied)
TUNER_SIGNATURES = "augtune_tuner.sig"  # tuner.pkl's: Tune writes it straight into the experiment
# every file `resume` unpickles: Tune's tuner, its experiment state (JSON with cloudpickled fields), its
# variant generator's and search generator's state (cloudpickles named .json), its callbacks' state, every
# searcher's (`searcher-state-*`, augtune's `entrants-search-state-*`, `search-then-repeat-state-*`)
STATE_PATTERNS = ("tuner.pkl", "*-state-*.pkl", "callback-states-*.pkl", "experiment_state-*.json",
                  "basic-variant-state-*.json", "search_gen_state-*.json")
EXPERIMENT_STATE = "experiment_state-*.json"  # the one state file that is JSON
KEY_FILE, LEDGER = "state.key", "signed.log"
LEDGER_KEEP = 200_000  # signatures kept in the ledger (~14 MB); the oldest go first


class Untrusted(ConfigError):
    """State in an experiment folder that this user's augtune did not sign."""


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "augtune"


def key() -> bytes:
    """This user's signing key, made on first use (32 random bytes, readable by the user alone)."""
    path = config_dir() / KEY_FILE
    try:
        data = _read_key(path)
        if len(data) >= 32:
            return data
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a stale one of a reused pid, or a planted link: removed, never followed
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    try:  # two first uses at once: the first key written stays
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    """The key file's bytes, refused in one line when another user could read or replace it: a key
    others can read lets them sign state that this user's resume would then unpickle."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise Untrusted(f"{path}: the signing key is a symbolic link; remove it (a new key is made)"
                        ) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_mode & 0o077 or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            raise Untrusted(f"{path}: the signing key is readable or writable by others (mode "
                            f"{st.st_mode & 0o777:o}) or not yours; anyone who can read it can forge state "
                            f"that resume would load: remove it (a new one is made) or chmod 600 it")
        return f.read()


def signature(name: str, data: bytes, secret: bytes | None = None) -> str:
    """The HMAC of a state file: its name and its bytes, under the user's key."""
    mac = hmac.new(secret or key(), name.encode() + b"\0", hashlib.sha256)
    mac.update(data)
    return mac.hexdigest()


def is_state(name: str) -> bool:
    return any(fnmatch(name, p) for p in STATE_PATTERNS)


def _files(location: str) -> dict[str, bytes]:
    """The state files directly in the folder at `location` (local or URI), by name."""
    from augtune.search.storage import names, read_bytes

    out = {}
    for name in names(location):
        if is_state(name):
            data = read_bytes(location, name)
            if data is not None:
                out[name] = data
    return out


def sign(location: str, only: Iterable[str] | None = None, file: str = SIGNATURES) -> None:
    """Sign the state files in the folder at `location` (those named in `only`, else all): the folder's
    signature `file` and the user's ledger."""
    from augtune.search.storage import read_text, write_bytes

    secret = key()
    files = _files(location)
    wanted = set(only) if only is not None else set(files)
    signed = {n: signature(n, d, secret) for n, d in files.items() if n in wanted}
    if not signed:
        return
    try:
        old = json.loads(read_text(location, file) or "{}")
        old = old if isinstance(old, dict) else {}
    except ValueError:
        old = {}
    kept = {n: s for n, s in old.items() if n in files and n not in signed}
    # the ledger first: it alone vouches when the folder cannot be written now. A full disk fails Tune's
    # own write of the state too, which says so; a resume then asks for --trust at worst
    with contextlib.suppress(OSError):
        remember(signed.values())
    with contextlib.suppress(OSError):
        write_bytes(location, file, json.dumps({**kept, **signed}, indent=1).encode())


def remember(signatures: Iterable[str]) -> None:
    """Add signatures to the user's ledger (appended; trimmed to its newest LEDGER_KEEP)."""
    path = config_dir() / LEDGER
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "a") as f:
        f.write("".join(f"{s}\n" for s in signatures))
    if path.stat().st_size > 66 * LEDGER_KEEP * 1.5:
        from augtune.records import write_atomic

        lines = path.read_text().splitlines()[-LEDGER_KEEP:]
        write_atomic(path, "".join(f"{s}\n" for s in lines), mode=0o600)


def _ledger() -> set[str]:
    try:
        return set((config_dir() / LEDGER).read_text().split())
    except FileNotFoundError:
        return set()


def _torn_json(name: str, data: bytes) -> bool:
    """A JSON state file that does not parse (cut short by a full disk or a killed copy): nothing in it
    can be unpickled (Tune parses the JSON first, and `resume` mends or refuses such a file), so it is
    not the signature's business. A pickle has no such guard: a cut one still runs its first opcodes."""
    if not fnmatch(name, EXPERIMENT_STATE):  # Tune's other `.json` state files are pickles
        return False
    try:
        json.loads(data)
    except ValueError:
        return True
    return False


def _listed(location: str) -> dict:
    from augtune.search.storage import read_text

    listed = {}
    for file in (SIGNATURES, TUNER_SIGNATURES):
        try:
            data = json.loads(read_text(location, file) or "{}")
        except ValueError:
            continue
        listed.update(data if isinstance(data, dict) else {})
    return listed


def verify(location: str, experiment: str | None = None) -> None:
    """Refuse, in one line and before anything is unpickled, a folder (local or URI) holding a state file
    this user's augtune did not sign: unsigned (another tool's, a hand-made one, augtune 0.3's) or
    signed with another key (`experiment`: the folder to name in the way out, `location` by default).
    `augtune resume --trust` is the user's word that the folder's writer is trusted."""
    files = _files(location)
    if not files:
        return
    listed = _listed(location)
    experiment = (experiment or location).rstrip("/")
    files = {n: d for n, d in files.items() if not _torn_json(n, d)}
    secret, ledger = key(), None
    for name, data in sorted(files.items()):
        mine = signature(name, data, secret)
        if hmac.compare_digest(str(listed.get(name, "")), mine):
            continue
        ledger = _ledger() if ledger is None else ledger
        if mine in ledger:
            continue
        why = "its signature does not match (changed since, or signed with another key)" \
            if name in listed else "not signed"
        raise Untrusted(
            f"{location.rstrip('/')}/{name}: {why} by your augtune; resume would load its pickled "
            f"objects (which can run code); if you trust whoever wrote it (or it is yours, from augtune "
            f"0.3), continue with: augtune resume --trust {experiment}"
        )
