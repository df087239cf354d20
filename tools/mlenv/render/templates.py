"""jinja2 templates compiled once and rendered without importing jinja2 (it costs more than the rest of a render).

jinja2 compiles each template of a directory to Python. The code objects are kept on disk, like .pyc files, keyed
by the templates' sizes and mtimes, the Python, jinja2 and this module; nothing rendered is ever kept. Rendering
runs that code against the small runtime below: the calls jinja2's compiled code makes for what these templates
use (attribute and item lookup, ``for`` over mappings and lists, ``with``/``include``, ``~``, the filters and tests
named in FILTERS and TESTS, ``finalize``). A template that needs anything else is found out when it is compiled,
and jinja2 itself renders that directory. tests/unit/test_templates.py checks both give the same bytes.
"""

# Imported where used: jinja2 (~230 ms measured on a busy host) only where templates are compiled or unsupported,
# mlenv.fastschema's cache helpers (~17 ms) only to find the compiled templates' file.
from __future__ import annotations

import marshal
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping
from types import CodeType
from typing import Any, cast

from mlenv.errors import OperationError

FORMAT = 2  # bump when the layout of cache files changes
FILTERS = {"join": "eval_context", "list": "eval_context"}
"""jinja2's built-in filters the runtime implements, with what jinja2 passes them first (checked when compiling);
a directory's own filters are passed in."""
TESTS = ("none", "defined")
ENVIRONMENT_CALLS = frozenset({"getattr", "getitem", "finalize", "undefined", "concat", "filters", "tests",
                               "get_template"})
CONTEXT_CALLS = frozenset({"resolve_or_missing", "get_all", "call", "eval_ctx"})
_IMPORT = re.compile(r"\Afrom jinja2\.runtime import [A-Za-z_, ]+\n")
_ENVIRONMENT = re.compile(r"\benvironment\.(\w+)")
_CONTEXT = re.compile(r"\bcontext\.(\w+)")
_LOOKUP = re.compile(r"environment\.(filters|tests)\['([^']+)'\]")
_UNSUPPORTED = re.compile(r"\b(LoopContext|Macro|Namespace|TemplateReference|markup_join|escape|Markup)\(")

missing: Any = type("MissingType", (), {"__repr__": lambda self: "missing"})()
"""What a name the template never set resolves to (identity-compared by the compiled code)."""


class UnsupportedTemplate(Exception):
    """The compiled template needs a part of jinja2's runtime that this one does not implement."""


class Undefined:
    """A value the template asked for that is not there: any use of it is an error, as with StrictUndefined."""

    def __init__(self, hint: str | None = None, obj: Any = missing, name: str | None = None, exc: Any = None) -> None:
        self._name = name

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise OperationError(f"a template uses {self._name!r}, which is undefined (this is an mlenv bug: please "
                             "report it)")

    __str__ = __iter__ = __len__ = __bool__ = __eq__ = __call__ = __getattr__ = __getitem__ = _fail
    __hash__ = None  # type: ignore[assignment]


class _EvalContext:
    autoescape = False
    volatile = False


def _join(eval_context: _EvalContext, value: Any, separator: str = "", attribute: Any = None) -> str:
    if attribute is not None:
        raise OperationError("the join filter's attribute argument is not supported (this is an mlenv bug)")
    return str(separator).join(map(str, value))


def _list(eval_context: _EvalContext, value: Any) -> list[Any]:
    return list(value)


def _internalcode(function: Callable[..., Any]) -> Callable[..., Any]:
    return function


class TemplateRuntimeError(Exception):
    """Raised by the compiled code for a filter or test that is not there."""


class _Context:
    """What a compiled template reads its variables through."""

    eval_ctx = _EvalContext()

    def __init__(self, parent: Mapping[str, Any]) -> None:
        self.parent = parent

    def resolve_or_missing(self, key: str) -> Any:
        return self.parent.get(key, missing)

    def get_all(self) -> dict[str, object]:
        return dict(self.parent)

    def call(__self, __obj: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("_loop_vars", None)
        kwargs.pop("_block_vars", None)
        if getattr(__obj, "jinja_pass_arg", None) is not None:
            raise OperationError("a template calls a jinja2 context function (this is an mlenv bug)")
        return __obj(*args, **kwargs)


class _Template:
    """One compiled template bound to the runtime."""

    def __init__(self, environment: _Environment, name: str, code: Any) -> None:
        namespace: dict[str, object] = {
            "environment": environment, "__file__": name, "missing": missing, "Undefined": Undefined,
            "internalcode": _internalcode, "TemplateRuntimeError": TemplateRuntimeError,
            "TemplateNotFound": LookupError, "identity": lambda value: value,
            "str_join": lambda parts: "".join(map(str, parts)),
        }
        exec(code, namespace)  # noqa: S102 - code jinja2 compiled from our own templates, checked when compiled
        self.root_render_func = cast("Callable[[_Context], Iterator[str]]", namespace["root"])

    def new_context(self, vars: Mapping[str, Any] | None = None, shared: bool = False,
                    locals: Mapping[str, Any] | None = None) -> _Context:
        parent = dict(vars or {})
        parent.update({key: value for key, value in (locals or {}).items() if value is not missing})
        return _Context(parent)

    def render(self, **context: Any) -> str:
        return "".join(self.root_render_func(self.new_context(context)))


class _Environment:
    """The part of jinja2.Environment that compiled templates call."""

    undefined = Undefined
    concat = "".join

    def __init__(self, codes: Mapping[str, Any], finalize: Callable[[Any], Any],
                 filters: Mapping[str, Callable[..., Any]]) -> None:
        self.finalize = finalize
        self.filters: dict[str, Callable[..., Any]] = {"join": _join, "list": _list, **filters}
        self.tests: dict[str, Callable[..., bool]] = {"none": lambda value: value is None,
                                                      "defined": lambda value: not isinstance(value, Undefined)}
        self._templates = {name: _Template(self, name, code) for name, code in codes.items()}

    def get_template(self, name: str, parent: str | None = None) -> _Template:
        return self._templates[name]

    @staticmethod
    def getattr(obj: Any, attribute: str) -> Any:
        try:
            return getattr(obj, attribute)
        except AttributeError:
            pass
        try:
            return obj[attribute]
        except (TypeError, LookupError, AttributeError):
            return Undefined(obj=obj, name=attribute)

    @staticmethod
    def getitem(obj: Any, argument: Any) -> Any:
        try:
            return obj[argument]
        except (AttributeError, TypeError, LookupError):
            if isinstance(argument, str):
                try:
                    return getattr(obj, argument)
                except AttributeError:
                    pass
            return Undefined(obj=obj, name=argument)


class Templates:
    """The templates of one directory, rendered through their compiled code (or by jinja2 when they need more)."""

    def __init__(self, directory: str, finalize: Callable[[Any], Any],
                 filters: Mapping[str, Callable[..., Any]] | None = None, **options: Any) -> None:
        self.directory = directory
        self.finalize = finalize
        self.filters = dict(filters or {})
        self.options = {"keep_trailing_newline": True, **options}
        self._runtime: _Environment | Any = None

    def render(self, name: str, **context: Any) -> str:
        """Template ``name`` rendered with ``context``."""
        if self._runtime is None:
            self._runtime = self._load()
        return str(self._runtime.get_template(name).render(**context))

    def jinja2_environment(self) -> Any:
        """jinja2's own environment for these templates."""
        import jinja2

        environment = jinja2.Environment(
            loader=jinja2.FileSystemLoader(self.directory), undefined=jinja2.StrictUndefined,
            finalize=self.finalize, autoescape=False, **self.options)  # noqa: S701 - YAML or shell, quoted by finalize
        environment.filters.update(self.filters)
        return environment

    def _load(self) -> _Environment | Any:
        names = sorted(entry for entry in os.listdir(self.directory) if entry.endswith(".j2"))
        path = self._cache_path(names)
        codes = _read(path) if path else None
        if codes is None or set(codes) != set(names):
            try:
                codes = self._compile(names)
            except UnsupportedTemplate:
                return self.jinja2_environment()
            if path:
                _write(path, codes)
        return _Environment(codes, self.finalize, self.filters)

    def _cache_path(self, names: list[str]) -> str | None:
        from importlib.util import find_spec

        from mlenv.fastschema import cache_directories, checksum_name

        spec = find_spec("jinja2")
        jinja = spec.origin if spec and spec.origin else ""
        stamps = [f"{name}:{st.st_size}:{st.st_mtime_ns}" for name in names
                  for st in [os.stat(os.path.join(self.directory, name))]]
        inputs = [str(FORMAT), sys.version, os.path.abspath(self.directory), *stamps,
                  *(f"{path}:{st.st_size}:{st.st_mtime_ns}" for path in (__file__, jinja) if path
                    for st in [os.stat(path)]),
                  repr(sorted(self.options.items())), repr(sorted(self.filters)),
                  f"{self.finalize.__module__}.{self.finalize.__qualname__}"]
        key = "\0".join(inputs)
        name = f"templates-{checksum_name(key)}.marshal"
        for directory in cache_directories():
            if _usable(directory):
                return os.path.join(directory, name)
        return None

    def _compile(self, names: list[str]) -> dict[str, CodeType]:
        environment = self.jinja2_environment()
        for name, passed in FILTERS.items():  # the compiled code passes what jinja2's own filter asks for
            if getattr(getattr(environment.filters[name], "jinja_pass_arg", None), "name", None) != passed:
                raise UnsupportedTemplate(f"jinja2's {name} filter no longer takes the {passed} first")
        codes = {}
        for name in names:
            source, filename, _ = environment.loader.get_source(environment, name)
            python = environment.compile(source, name, filename, raw=True)
            _check(name, python, set(self.filters))
            codes[name] = compile(_IMPORT.sub("", python, count=1), filename, "exec")
        return codes


def _check(name: str, python: str, filters: set[str]) -> None:
    """Unsupported when the compiled code of ``name`` calls what the runtime does not implement."""
    if not _IMPORT.match(python):
        raise UnsupportedTemplate(f"{name}: unexpected compiled code")
    known = {"filters": set(FILTERS) | filters, "tests": set(TESTS)}
    needed = [f"environment.{attr}" for attr in _ENVIRONMENT.findall(python) if attr not in ENVIRONMENT_CALLS]
    needed += [f"context.{attr}" for attr in _CONTEXT.findall(python) if attr not in CONTEXT_CALLS]
    needed += [f"{kind} {which}" for kind, which in _LOOKUP.findall(python) if which not in known[kind]]
    needed += _UNSUPPORTED.findall(python)
    if needed:
        raise UnsupportedTemplate(f"{name} needs {', '.join(sorted(set(needed)))}")


def _usable(directory: str) -> bool:
    """A cache directory of this user's that nobody else may write (its files are executed)."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        info = os.stat(directory)
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & 0o022


def _read(path: str) -> dict[str, CodeType] | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    seal, body = data[:4], data[4:]
    if seal != _seal(body):
        return None
    try:
        codes = marshal.loads(body)  # noqa: S302 - our own file, sealed with its checksum, in a directory only we write
    except (ValueError, EOFError, TypeError):
        return None
    return codes if isinstance(codes, dict) else None


def _seal(body: bytes) -> bytes:
    """What a cache file starts with: the CRC-32 of the rest, so that a file cut short or damaged is not used."""
    return zlib.crc32(body).to_bytes(4, "big")


def _write(path: str, codes: Mapping[str, Any]) -> None:
    body = marshal.dumps(dict(codes))
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as handle:
            handle.write(_seal(body) + body)
        os.replace(temporary, path)
    except OSError:
        return
