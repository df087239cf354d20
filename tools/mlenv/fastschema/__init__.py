"""Compiled JSON Schema validators, cached on disk like .pyc files: a hit parses no schema, imports no jsonschema.

    is_valid = compiled(key, load)   # load() -> (root schema, {uri: document that its $refs point into})
    if not is_valid(instance):       # then ask jsonschema for the error messages
        ...

``key`` is a cheap identity of the schema computed by the caller (package version, path, size, mtime...); ``load``
runs only on a cache miss. ``is_valid`` answers exactly as ``patterns.draft202012()(schema, registry=...).is_valid``
(jsonschema's Draft202012Validator with default settings, formats not asserted, a pattern's ``$`` the end of the
value as in JSON Schema). A schema using something the compiler does not implement raises :class:`Unsupported` on
the miss: validate it with jsonschema instead.

The generated module is written atomically to the first usable cache directory of ``$MLENV_CACHE_DIR``,
``$XDG_CACHE_HOME/mlenv/validators``, ``~/.cache/mlenv/validators`` (usable: a directory owned by the user and not
writable by others, since its files are executed) and imported from there, so CPython's bytecode cache applies;
where none is usable it is compiled in memory. File names hash the key and stamp the code generating them
(``SOURCES``); a file whose checksum, key or import fails is rebuilt. Validators are cached, never what they are
used for.
"""

# Imported on a cache miss only: json (~38 ms on a busy host), the compiler (~86 ms) and the store (~65 ms); a
# validator found on disk needs none of them.
from __future__ import annotations

import os
import sys
import zlib
from importlib.machinery import SourceFileLoader

TYPE_CHECKING = False  # typing and collections.abc are not imported at run time: this module is on the fast path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TypeAlias

    from mlenv.runtime.records.jsonvalue import JsonValue

    Validator: TypeAlias = Callable[[object], bool]
    Loader: TypeAlias = Callable[[], tuple[JsonValue, Mapping[str, JsonValue]]]

FORMAT = 1  # bump when the layout of cache files changes
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = (os.path.join(HERE, "compiler.py"), os.path.join(HERE, "patterns.py"))  # what generated code depends on
SEAL = b"# crc32 "

_validators: dict[str, Validator] = {}


class Unsupported(ValueError):
    """The schema needs a keyword or feature the compiler does not implement exactly: use jsonschema."""


def compiled(key: str, load: Loader) -> Validator:
    """``is_valid(instance) -> bool`` for the schema identified by ``key``; ``load`` is called only on a miss."""
    validator = _validators.get(key)
    if validator is None:
        validator = _validators[key] = _validator(key, load)
    return validator


def compiled_files(root: str, *documents: str) -> Validator:
    """``compiled`` for a schema in JSON files, keyed by their paths, sizes and mtimes.

    Each of ``documents`` is found by its ``$id``, else by its file name relative to the root's ``$id``.
    """
    paths = [os.path.abspath(path) for path in (root, *documents)]
    stats = [os.stat(path) for path in paths]
    key = "files|" + "|".join(f"{path}:{st.st_size}:{st.st_mtime_ns}" for path, st in zip(paths, stats, strict=True))
    return compiled(key, lambda: _read_json(paths))


def forget() -> None:
    """Drop the validators held by this process (the files stay): the next ``compiled`` looks at the disk again."""
    _validators.clear()


def cache_directories() -> list[str]:
    """Where compiled validators may live, in order of preference."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [path for path in (os.environ.get("MLENV_CACHE_DIR"), os.path.join(home, "mlenv", "validators")) if path]


def _read_json(paths: list[str]) -> tuple[JsonValue, dict[str, JsonValue]]:
    import json

    def read(path: str) -> JsonValue:
        with open(path, encoding="utf-8") as handle:
            value: JsonValue = json.load(handle)
        return value

    return read(paths[0]), {os.path.basename(path): read(path) for path in paths[1:]}


def checksum_name(key: str) -> str:
    """A cache file's name for ``key``: two checksums of it (hashlib would cost every cold start ~2 ms)."""
    data = key.encode("utf-8", "surrogatepass")
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def _file_name(key: str) -> str:
    stats = [os.stat(source) for source in SOURCES]
    stamp = zlib.crc32(":".join([str(FORMAT), *(f"{st.st_size}:{st.st_mtime_ns}" for st in stats)]).encode())
    return f"{checksum_name(key)}-{stamp:08x}.py"


def _usable(directory: str) -> bool:
    try:
        stat = os.stat(directory)
    except OSError:
        return False
    return stat.st_uid == os.getuid() and not stat.st_mode & 0o022


def _validator(key: str, load: Loader) -> Validator:
    name = _file_name(key)
    directories = [directory for directory in cache_directories() if _usable(directory)]
    for directory in directories:
        validator = _cached(os.path.join(directory, name), key)
        if validator is not None:
            return validator
    from mlenv.fastschema import store
    from mlenv.fastschema.compiler import generate

    source = generate(key, *load()).encode("utf-8")
    source += SEAL + b"%08x\n" % zlib.crc32(source)
    for directory in store.writable(cache_directories(), _usable):
        path = os.path.join(directory, name)
        if store.save(path, source):
            validator = _cached(path, key)
            if validator is not None:
                return validator
    return store.in_memory(source, key)


def _cached(path: str, key: str) -> Validator | None:
    """The validator in ``path`` if the file is intact and made for ``key``, else None."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    body, seal, checksum = data.rpartition(SEAL)
    if not seal or checksum != b"%08x\n" % zlib.crc32(body):
        return None
    module = type(sys)(os.path.basename(path)[:-3])
    module.__file__ = path
    try:
        SourceFileLoader(module.__name__, path).exec_module(module)
    except Exception:  # a corrupt bytecode file or anything else: rebuild, never trust it
        return None
    validator = getattr(module, "is_valid", None) if getattr(module, "KEY", None) == key else None
    return validator if callable(validator) else None
