"""Expectations: divergences known to happen, each with the reason (and vLLM source) why.

``conformance/expectations.toml`` lists them::

    [[expectation]]
    id = "mrv2-draft-keeps-attention-backend"    # unique; letters, digits, . _ -
    kind = "mrv1_mrv2_mismatch"                   # one of conformance.diff.KINDS
    case = "gqa+draft-attention-backend-*"        # optional glob on the case name ("*")
    field = "*"                                   # optional glob on Divergence.field ("*"), or a list of globs
    observed = "*"                                # optional glob on what vLLM showed (str(Divergence.observed), "*")
    backend = "FLASHINFER"                        # optional: a backend one of the case's layers runs
    layout = "LBNHC"                              # optional: the case's requested or resolved layout, or a list
    runner = "mrv1/mrv2"                          # optional: mrv1, mrv2 or mrv1/mrv2 (runner pairs)
    options = ["attention_backend"]               # optional: engine options the case sets
    without = ["speculative_attention_backend"]   # optional: engine options the case leaves unset
    vllm = ">=0.33,<0.34"                         # optional version range of the installed vLLM
    reason = "why, citing the vLLM source (vllm/...py: function)"

``classify(divergences, env)`` splits divergences into expected ones (each paired with the
first entry, in file order, that matches it) and unexpected ones (which fail a run), and
lists the entries that matched nothing (``unused``: stale entries to delete). An entry
for another vLLM version, or scoped to cases that did not run, is not reported unused.

A consumer layers its own files on the shipped one (``load_layered``; ``kvconform run
--expectations FILE``, repeatable; the pytest ini option ``kvconform_expectations``): the
shipped entries come first, then each file's, so a consumer's entry adds to the shipped
ones and never overrides one that matches first. Ids are unique across all the files, and
each entry records its file (``Expectation.source``). See docs/expectations.md.

Version ranges are comma-separated clauses ``OP VERSION`` with OP one of ``>= <= > < == !=``
(a bare version means ``==``; ``==0.33.*`` / ``!=0.33.*`` match a release series).
Installed versions are compared by their release numbers only: suffixes (``rc1``,
``.dev12``, ``+cu128``) are dropped, so ``0.33.1.dev12`` is 0.33.1 and ``0.34.0rc1`` is
0.34.0 (outside ``<0.34``: a pre-release already has the next release's code).
Missing trailing components are zeros (``0.33`` == ``0.33.0``).

Reading needs ``tomllib`` (Python 3.11+) or the ``tomli`` package on 3.10. Errors are one
line (``ExpectationsError``, a ``ConfigError``) naming the file, entry, value and what was
expected.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from conformance.diff import KINDS, RUNNER_PAIR, Divergence
from reference.errors import ConfigError
from reference.layout import LAYOUT_ALIASES as _LAYOUT_ALIASES
from reference.layout import LAYOUT_NAMES as _LAYOUTS

DEFAULT_PATH = Path(__file__).with_name("expectations.toml")
RUN_KINDS = tuple(k for k in KINDS if k != "connector_copy_plan")
"""What ``kvconform run`` can diverge in: everything but the connector checks' copy plans
(``kvconform check``), whose entries a run therefore never reports unused."""
SCHEMA = 1
RUNNERS = ("mrv1", "mrv2", RUNNER_PAIR)
_TOP_KEYS = ("schema", "expectation")
_REQUIRED = ("id", "kind", "reason")
_OPTIONAL = ("case", "field", "observed", "backend", "layout", "runner", "options", "without", "vllm")
OPTION_NAMES = (
    "attention_backend",
    "speculative_attention_backend",
    "connector",
    "layout",
    "kv_cache_memory_bytes",
    "tensor_parallel_size",
    "decode_context_parallel_size",
    "prefill_context_parallel_size",
    "disable_hybrid_kv_cache_manager",
    "draft",
)
"""What ``options`` / ``without`` can name: a ``CaseConfig`` field set away from its
default (``--attention-backend`` given, a TP/DCP/PCP size above 1, ...), or ``draft`` (the
case has a speculative draft layer)."""
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


class ExpectationsError(ConfigError):
    """The expectations file is malformed: one line naming the value and what was expected."""


# --- versions --------------------------------------------------------------------------------

_SPEC_VERSION = re.compile(r"(\d+(?:\.\d+)*)(\.\*)?\Z")
_OPS = (">=", "<=", "==", "!=", ">", "<")


def release(version: str) -> tuple[int, ...]:
    """The release numbers of an installed version, trailing zeros dropped.

    ``"0.33.0"`` -> ``(0, 33)``; ``"0.33.1.dev12+g1a2b"`` -> ``(0, 33, 1)``. Raises
    ValueError when the text does not start with a version number.
    """
    from reference.releases import parse_version  # the one version parser

    try:
        return _strip(parse_version(version.strip()))
    except ValueError:
        raise ValueError(f"version {version!r} does not start with a release number like 0.33.0") from None


def _strip(parts: tuple[int, ...]) -> tuple[int, ...]:
    while len(parts) > 1 and parts[-1] == 0:
        parts = parts[:-1]
    return parts


@dataclass(frozen=True)
class Clause:
    """One ``OP VERSION`` of a range; ``prefix`` for ``==X.*`` / ``!=X.*``."""

    op: str
    version: tuple[int, ...]
    prefix: bool = False

    def __call__(self, installed: tuple[int, ...]) -> bool:
        if self.prefix:
            # X.* is a series: compare the first len(X) components, zero-padded.
            width = len(self.version)
            head = (installed + (0,) * width)[:width]
            inside = head == self.version
            return inside if self.op == "==" else not inside
        a, b = _pad(installed, self.version)
        return {
            ">=": a >= b,
            "<=": a <= b,
            ">": a > b,
            "<": a < b,
            "==": a == b,
            "!=": a != b,
        }[self.op]


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


@dataclass(frozen=True)
class VersionRange:
    """A comma-separated set of clauses, all of which must hold (``">=0.33,<0.34"``)."""

    text: str
    clauses: tuple[Clause, ...]

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        """Raises ValueError naming the clause that is not ``OP VERSION``."""
        if not isinstance(text, str):
            raise ValueError(f"version range {text!r} must be a quoted string like '>=0.33,<0.34'")
        if not text.strip():
            raise ValueError(f"version range {text!r} is empty; expected e.g. '>=0.33,<0.34'")
        clauses = []
        for raw in text.split(","):
            item = raw.strip()
            op = next((o for o in _OPS if item.startswith(o)), "==")
            rest = item[len(op):].strip() if item.startswith(op) else item
            match = _SPEC_VERSION.match(rest)
            if match is None:
                raise ValueError(
                    f"version range {text!r}: clause {item!r} is not OP VERSION "
                    f"(OP one of {' '.join(_OPS)}; VERSION like 0.33 or 0.33.*)"
                )
            prefix = match.group(2) is not None
            if prefix and op not in ("==", "!="):
                raise ValueError(f"version range {text!r}: clause {item!r}: '.*' only goes with == or !=")
            numbers = tuple(int(p) for p in match.group(1).split("."))
            clauses.append(Clause(op, numbers if prefix else _strip(numbers), prefix))
        return cls(text, tuple(clauses))

    def contains(self, version: str) -> bool:
        """Whether an installed version (suffixes ignored) satisfies every clause."""
        installed = release(version)
        return all(clause(installed) for clause in self.clauses)

    def __str__(self) -> str:
        return self.text


# --- entries and files -----------------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    """One known divergence: what it matches and why it is expected."""

    id: str
    kind: str
    reason: str
    case: str = "*"
    field: str | tuple[str, ...] = "*"
    """A glob on ``Divergence.field``, or several (any may match)."""
    observed: str = "*"
    """A glob on what vLLM showed (``str(Divergence.observed)``): narrows an entry to one observed value, e.g.
    one exception of vLLM's (``"ZeroDivisionError*"``) rather than any error."""
    backend: str | None = None
    layout: str | tuple[str, ...] | None = None
    """The case's requested or resolved layout, or several (any may be the case's)."""
    runner: str | None = None
    options: tuple[str, ...] = ()
    without: tuple[str, ...] = ()
    vllm: VersionRange | None = None
    source: str = dataclasses.field(default="", compare=False)  # ``field`` is the glob above
    """The file the entry came from, as named to the user (``conformance/expectations.toml``
    for the shipped file, a consumer's path as given); "" for an entry made in code. Not
    part of the entry's identity (``==``)."""

    def applies_to(self, vllm_version: str | None) -> bool:
        """Whether the entry is in force for this vLLM (no range: always)."""
        if self.vllm is None:
            return True
        if vllm_version is None:
            return False  # a range cannot hold for an unknown version
        try:
            return self.vllm.contains(vllm_version)
        except ValueError:
            return False

    def matches(self, divergence: Divergence, facts: CaseFacts | None) -> bool:
        """Kind, case, field and runner from the divergence; backend and layout from the case."""
        if divergence.kind != self.kind:
            return False
        if not fnmatchcase(divergence.case, self.case):
            return False
        globs = (self.field,) if isinstance(self.field, str) else self.field
        if not any(fnmatchcase(divergence.field, glob) for glob in globs):
            return False
        if self.observed != "*" and not fnmatchcase(str(divergence.observed), self.observed):
            return False
        if self.runner is not None and divergence.runner != self.runner:
            return False
        if self.backend is not None and (facts is None or self.backend not in facts.backends):
            return False
        if self.layout is not None:
            layouts = (self.layout,) if isinstance(self.layout, str) else self.layout
            if facts is None or not set(layouts) & set(facts.layouts):
                return False
        return self.scoped_to(facts)

    def scoped_to(self, facts: CaseFacts | None) -> bool:
        """Whether a case with these facts sets every ``options`` and none of ``without``."""
        if not self.options and not self.without:
            return True
        if facts is None:
            return False
        return set(self.options) <= facts.options and not set(self.without) & facts.options

    def describe(self) -> str:
        """One line: the id and what it is scoped to."""
        scope = [f"kind={self.kind}", f"case={self.case}"]
        for name in ("field", "observed", "backend", "layout", "runner", "options", "without", "vllm"):
            value = getattr(self, name)
            if isinstance(value, tuple):
                value = ",".join(value) or None
            if value is not None and value != "*":
                scope.append(f"{name}={value}")
        return f"{self.id} ({', '.join(scope)})"


def _fail(where: str, message: str) -> ExpectationsError:
    return ExpectationsError(f"{where}: {message}")


def _string(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, f"{key} {value!r} must be a non-empty string")
    return value


def _entry(where: str, raw: Any, backends: Sequence[str]) -> Expectation:
    if not isinstance(raw, dict):
        raise _fail(where, f"{raw!r} is not a table; write each entry as [[expectation]]")
    unknown = [k for k in raw if k not in _REQUIRED + _OPTIONAL]
    if unknown:
        raise _fail(where, f"key {unknown[0]!r} is not one of {', '.join(_REQUIRED + _OPTIONAL)}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise _fail(where, f"required key {missing[0]!r} is missing (required: {', '.join(_REQUIRED)})")
    ident = _string(where, "id", raw["id"])
    if not _ID.match(ident):
        raise _fail(where, f"id {ident!r} must be letters, digits, '.', '_' or '-' (starting with a letter or digit)")
    where = f"{where} (id {ident!r})"
    kind = _string(where, "kind", raw["kind"])
    if kind not in KINDS:
        raise _fail(where, f"kind {kind!r} is not one of {', '.join(KINDS)}")
    values: dict[str, Any] = {"id": ident, "kind": kind, "reason": _string(where, "reason", raw["reason"]).strip()}
    if "case" in raw:
        values["case"] = _string(where, "case", raw["case"])
    if "field" in raw:
        fields = raw["field"]
        if isinstance(fields, list):
            if not fields:
                raise _fail(where, "field [] must name at least one glob")
            values["field"] = tuple(_string(where, "field", f) for f in fields)
        else:
            values["field"] = _string(where, "field", fields)
    if "observed" in raw:
        values["observed"] = _string(where, "observed", raw["observed"])
    if "backend" in raw:
        backend = _string(where, "backend", raw["backend"])
        if backends and backend not in backends:
            raise _fail(where, f"backend {backend!r} is not one of {', '.join(backends)}")
        values["backend"] = backend
    if "layout" in raw:
        given = raw["layout"]
        names = given if isinstance(given, list) else [given]
        if not names or not all(isinstance(name, str) and name.strip() for name in names):
            raise _fail(where, f"layout {given!r} must be a layout name or a non-empty list of them")
        layouts = []
        for name in names:
            layout = _LAYOUT_ALIASES.get(name, name)
            if layout not in _LAYOUTS:
                raise _fail(where, f"layout {name!r} is not one of {', '.join(_LAYOUTS + tuple(_LAYOUT_ALIASES))}")
            layouts.append(layout)
        values["layout"] = layouts[0] if len(layouts) == 1 else tuple(layouts)
    if "runner" in raw:
        runner = _string(where, "runner", raw["runner"])
        if runner not in RUNNERS:
            raise _fail(where, f"runner {runner!r} is not one of {', '.join(RUNNERS)}")
        if kind == "mrv1_mrv2_mismatch" and runner != RUNNER_PAIR:
            raise _fail(where, f"runner {runner!r}: kind mrv1_mrv2_mismatch is always reported for runner {RUNNER_PAIR!r}")
        values["runner"] = runner
    for key in ("options", "without"):
        if key in raw:
            names = raw[key]
            if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
                raise _fail(where, f"{key} {names!r} must be a non-empty array of option names")
            bad = [n for n in names if n not in OPTION_NAMES]
            if bad:
                raise _fail(where, f"{key}: option {bad[0]!r} is not one of {', '.join(OPTION_NAMES)}")
            values[key] = tuple(names)
    if "vllm" in raw:
        try:
            values["vllm"] = VersionRange.parse(raw["vllm"])
        except ValueError as exc:
            raise _fail(where, f"vllm: {exc}") from None
    return Expectation(**values)


def _known_backends() -> tuple[str, ...]:
    from reference.backends import BACKENDS

    return tuple(BACKENDS)


def loads(text: str, source: str = "<expectations>") -> tuple[Expectation, ...]:
    """Parse and validate expectations TOML; raises ExpectationsError (one line)."""
    toml = _toml_module(source)
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise _fail(source, f"not valid TOML: {exc}") from None
    except RecursionError:
        raise _fail(source, "TOML nested too deep to be an expectations file (a list of [[expectation]] tables)") from None
    unknown = [k for k in data if k not in _TOP_KEYS]
    if unknown:
        raise _fail(source, f"top-level key {unknown[0]!r} is not one of {', '.join(_TOP_KEYS)}")
    if "schema" in data and data["schema"] != SCHEMA:
        raise _fail(source, f"schema {data['schema']!r} is not {SCHEMA}, the only schema this kvconform reads")
    entries = data.get("expectation", [])
    if not isinstance(entries, list):
        raise _fail(source, f"expectation {entries!r} must be an array of tables ([[expectation]])")
    backends = _known_backends()
    out: list[Expectation] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(entries, 1):
        entry = _entry(f"{source}: expectation {index}", raw, backends)
        if entry.id in seen:
            raise _fail(f"{source}: expectation {index}", f"id {entry.id!r} is already used by expectation {seen[entry.id]}")
        seen[entry.id] = index
        out.append(replace(entry, source=source))
    return tuple(out)


def load(path: str | Path | None = None) -> tuple[Expectation, ...]:
    """Read an expectations file (default: the shipped ``conformance/expectations.toml``)."""
    target = Path(path) if path is not None else DEFAULT_PATH
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ExpectationsError(f"expectations file {str(target)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ExpectationsError(f"expectations file {str(target)!r} cannot be read: {exc}") from None
    entries = loads(text, source=str(target))
    if target.resolve() == DEFAULT_PATH.resolve():  # named as in the source tree, not by this machine's path
        entries = tuple(replace(e, source=SHIPPED_SOURCE) for e in entries)
    return entries


SHIPPED_SOURCE = "conformance/expectations.toml"
"""The ``source`` of the shipped file's entries: named as in the source tree, so reports and
messages do not carry this machine's paths."""


def _label(path: str | Path) -> str:
    return str(Path(path))


def load_layered(
    paths: Sequence[str | Path] = (), *, shipped: bool = True, labels: Sequence[str] | None = None
) -> tuple[Expectation, ...]:
    """The shipped file's entries (unless ``shipped`` is False), then each file's in ``paths``, in order.

    This is the order ``classify`` tries entries in, and the first entry that matches a
    divergence is the one that expects it: a consumer's file therefore adds entries and
    cannot override (re-scope, re-word or disable) a shipped entry that matches first.
    Ids must be unique across every layered file; a duplicate is an ``ExpectationsError``
    (one line) naming both files, as is a file layered twice. Each entry's ``source`` is
    its file: ``SHIPPED_SOURCE``, or ``labels[i]`` (default: the path as given) for
    ``paths[i]``.
    """
    paths = list(paths)
    names = [_label(p) for p in paths] if labels is None else [str(n) for n in labels]
    if len(names) != len(paths):
        raise ValueError(f"{len(labels or ())} labels for {len(paths)} expectations files")
    layers: list[tuple[str, Path]] = ([(SHIPPED_SOURCE, DEFAULT_PATH)] if shipped else []) + [
        (name, Path(path)) for name, path in zip(names, paths)
    ]
    seen_files: dict[Path, str] = {}
    seen_ids: dict[str, tuple[str, int]] = {}
    out: list[Expectation] = []
    for name, path in layers:
        resolved = path.resolve()
        if resolved in seen_files:
            hint = " (the shipped file is always layered first unless --no-shipped-expectations)" if seen_files[resolved] == SHIPPED_SOURCE else ""
            raise ExpectationsError(f"expectations file {name!r} is layered twice: it is also {seen_files[resolved]!r}{hint}")
        seen_files[resolved] = name
        for index, entry in enumerate(load(path), 1):
            if entry.id in seen_ids:
                first, at = seen_ids[entry.id]
                hint = (" (a copy of the shipped file? --no-shipped-expectations uses yours instead)"
                        if first == SHIPPED_SOURCE else "")
                raise ExpectationsError(
                    f"{name}: expectation {index}: id {entry.id!r} is already used by expectation {at} of {first}; "
                    f"ids must be unique across the layered expectations files{hint}"
                )
            seen_ids[entry.id] = (name, index)
            out.append(replace(entry, source=name))
    return tuple(out)


def describe_layers(paths: Sequence[str | Path] = (), *, shipped: bool = True, labels: Sequence[str] | None = None) -> str | None:
    """Every layered file in order, one string (the report's ``expectations.file``): e.g.
    ``conformance/expectations.toml (shipped) + ci/kvconform-expectations.toml``; None: no file."""
    names = [_label(p) for p in paths] if labels is None else [str(n) for n in labels]
    parts = ([f"{SHIPPED_SOURCE} (shipped)"] if shipped else []) + names
    return " + ".join(parts) or None


def _toml_module(source: str):
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ExpectationsError(f"{source}: reading expectations needs Python 3.11+ (tomllib) or the tomli package") from None
    return tomllib


# --- classification --------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseFacts:
    """What an entry's ``backend`` / ``layout`` match against, for one case."""

    backends: frozenset[str] = frozenset()
    """Every backend a layer of the case runs under (either runner)."""
    layouts: frozenset[str] = frozenset()
    """The requested layout (generation-1 names resolved) and the layouts vLLM resolved."""
    options: frozenset[str] = frozenset()
    """The ``OPTION_NAMES`` the case sets."""


_OPTION_DEFAULTS: dict[str, Any] = {
    "tensor_parallel_size": 1,
    "decode_context_parallel_size": 1,
    "prefill_context_parallel_size": 1,
    "disable_hybrid_kv_cache_manager": False,
}


def case_options(case: Any) -> frozenset[str]:
    """Which ``OPTION_NAMES`` a case sets (fields away from their default; ``draft``)."""
    found = {
        name
        for name in OPTION_NAMES
        if name != "draft" and getattr(case, name, None) not in (None, _OPTION_DEFAULTS.get(name))
    }
    if any(getattr(layer, "is_draft", False) for layer in getattr(case, "layers", ())):
        found.add("draft")
    return frozenset(found)


def case_facts(case: Any, observations: Iterable[Any] = ()) -> CaseFacts:
    """Facts of a ``CaseConfig``, widened by the observations' backends and layouts."""
    backends = {layer.backend for layer in case.layers}
    for extra in (getattr(case, "attention_backend", None), getattr(case, "speculative_attention_backend", None)):
        if extra:
            backends.add(extra)
    layouts = set()
    if getattr(case, "layout", None):
        layouts.add(_LAYOUT_ALIASES.get(case.layout, case.layout))
    for obs in observations:
        if obs is None:
            continue
        backends.update((getattr(obs, "layer_backends", None) or {}).values())
        if getattr(obs, "layout", None):
            layouts.add(obs.layout)
    return CaseFacts(frozenset(backends), frozenset(layouts), case_options(case))


@dataclass(frozen=True)
class Environment:
    """What classification needs to know about the run."""

    vllm_version: str | None
    cases: Mapping[str, CaseFacts] = field(default_factory=dict)
    """The cases that ran, by name. Empty: unknown (every entry in force may be unused)."""
    facts_release: str | None = None
    """The release whose facts the run is judged by, where that is not the installed one (an
    unreleased build judged by the newest facts): an entry in force for it is in force too."""


@dataclass(frozen=True)
class Match:
    """An expected divergence and the entry that expects it."""

    divergence: Divergence
    expectation: Expectation

    @property
    def message(self) -> str:
        return f"{self.divergence.message} [expected: {self.expectation.id}]"


class Classification(NamedTuple):
    """``classify``'s answer; unpacks as ``expected, unexpected, unused``."""

    expected: tuple[Match, ...]
    unexpected: tuple[Divergence, ...]
    unused: tuple[Expectation, ...]

    def expectation_for(self, divergence: Divergence) -> Expectation | None:
        """The entry that expects this very divergence object, or None (unexpected)."""
        # By identity: divergences carry lists and dicts, so they are not hashable,
        # and two equal divergences of different runs are still two findings.
        return next((m.expectation for m in self.expected if m.divergence is divergence), None)


def _environment(env: Environment | Mapping[str, Any] | None) -> Environment:
    if isinstance(env, Environment):
        return env
    if env is None:
        return Environment(None)
    # vllm_run's report environment: {"vllm": "0.33.0", ...}, optionally "cases".
    return Environment(env.get("vllm"), env.get("cases") or {})


def classify(
    divergences: Iterable[Divergence],
    env: Environment | Mapping[str, Any] | None,
    expectations: Sequence[Expectation] | None = None,
    kinds: Iterable[str] | None = None,
) -> Classification:
    """Split divergences into expected and unexpected; list entries that matched nothing.

    ``expectations`` defaults to the shipped file. An entry is in force when its ``vllm``
    range holds for ``env``'s version; it can be unused only if it is in force, of one of
    ``kinds`` (the divergence kinds the check can produce; default: all) and (when ``env``
    names the cases that ran) its ``case`` glob matches one of them.
    """
    entries = load() if expectations is None else tuple(expectations)
    environment = _environment(env)
    active = [e for e in entries if e.applies_to(environment.vllm_version)
              or (environment.facts_release is not None and e.applies_to(environment.facts_release))]
    used: set[str] = set()
    expected: list[Match] = []
    unexpected: list[Divergence] = []
    for divergence in divergences:
        facts = environment.cases.get(divergence.case)
        entry = next((e for e in active if e.matches(divergence, facts)), None)
        if entry is None:
            unexpected.append(divergence)
        else:
            expected.append(Match(divergence, entry))
            used.add(entry.id)
    ran = list(environment.cases)
    checked = None if kinds is None else frozenset(kinds)
    unused = tuple(
        e
        for e in active
        if e.id not in used
        and (checked is None or e.kind in checked)
        and (not ran or any(fnmatchcase(name, e.case) and e.scoped_to(environment.cases[name]) for name in ran))
    )
    return Classification(tuple(expected), tuple(unexpected), unused)


__all__ = [
    "DEFAULT_PATH",
    "CaseFacts",
    "Classification",
    "Environment",
    "Expectation",
    "ExpectationsError",
    "Match",
    "VersionRange",
    "OPTION_NAMES",
    "case_facts",
    "case_options",
    "SHIPPED_SOURCE",
    "classify",
    "describe_layers",
    "load",
    "load_layered",
    "loads",
    "release",
]
