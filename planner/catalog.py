"""Find and load the YAML catalogs (models, hardware profiles, framework profiles), aliases, and
user files.

The catalogs live in ``models/``, ``hardware_profiles/`` and ``framework_profiles/`` at the
repository root; a built wheel carries them as ``planner/_catalog/...`` (see pyproject.toml).
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import UsageError
from .framework_spec import FrameworkProfile, merge_extends
from .specs import HardwareProfile, ModelSpec

T = TypeVar("T", bound=BaseModel)

_PACKAGE_DIR = Path(__file__).resolve().parent


def catalog_dir(kind: str) -> Path:
    """Directory of a catalog (``models`` or ``hardware_profiles``): the wheel's copy, else the repo's."""
    for candidate in (_PACKAGE_DIR / "_catalog" / kind, _PACKAGE_DIR.parent / kind):
        if candidate.is_dir():
            return candidate
    raise UsageError(f"the {kind} catalog is missing from this installation")


class _UniqueKeys:
    """Loader mixin that rejects a mapping with the same key twice (YAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


class _UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """SafeLoader that rejects a mapping with the same key twice (YAML would keep the last)."""


_FAST_LOADER = type("_CUniqueKeyLoader", (_UniqueKeys, yaml.CSafeLoader), {}) \
    if hasattr(yaml, "CSafeLoader") else _UniqueKeyLoader


def read_yaml(path: Path) -> object:
    """Parse a YAML file; raises UsageError (one line) if it is missing, not UTF-8 text, empty,
    malformed, or repeats a key."""
    if path.is_dir():
        raise UsageError(f"{path} is a directory, not a YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not a UTF-8 text (YAML) file") from None
    if not text.strip():
        raise UsageError(f"{path} is empty")
    try:
        # libyaml's parser when PyYAML has it (~10x faster on the catalog, same safe subset and
        # duplicate-key check); a file it rejects is parsed again by the pure-Python loader,
        # whose error message (and line, column) is the one reported
        try:
            return yaml.load(text, Loader=_FAST_LOADER)  # noqa: S506 (a SafeLoader subclass)
        except yaml.YAMLError:
            return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise UsageError(f"{path}: {problem}{where}") from None


def validate(cls: type[T], data: object, origin: str) -> T:
    """Validate ``data`` as ``cls``; turns pydantic's report into one line naming the field."""
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a single string"}.get(type(data), f"a {type(data).__name__}")
        raise UsageError(f"{origin}: expected a mapping of fields (name: value), got {kind}")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"{origin}: {describe_validation_error(exc)}") from None
    except UsageError as exc:  # raised by quantity parsing inside a validator
        raise UsageError(f"{origin}: {exc}") from None


def describe_validation_error(exc: ValidationError) -> str:
    """The first problem of a pydantic error, as 'field.path: message' (+ how many more)."""
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"])
    msg = first["msg"]
    if first["type"] == "missing":
        msg = "missing required field"
    elif first["type"] == "extra_forbidden":
        msg = "unknown field"
    msg = msg.removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{loc}: {msg}{more}" if loc else f"{msg}{more}"


@lru_cache(maxsize=None)
def _load_all(kind: str) -> dict[str, BaseModel]:
    if kind == FRAMEWORKS:
        raw = _framework_raw()
        return {name: validate_framework(data, str(path), raw) for name, (path, data) in raw.items()}
    cls = ModelSpec if kind == "models" else HardwareProfile
    entries: dict[str, BaseModel] = {}
    for path in sorted(catalog_dir(kind).glob("*.yaml")):
        spec = validate(cls, read_yaml(path), str(path))
        entries[spec.name] = spec
    return entries


FRAMEWORKS = "framework_profiles"


@lru_cache(maxsize=None)
def _framework_raw() -> dict[str, tuple[Path, dict]]:
    """The shipped framework profiles as parsed YAML, by name (``extends`` not yet resolved)."""
    raw: dict[str, tuple[Path, dict]] = {}
    for path in sorted(catalog_dir(FRAMEWORKS).glob("*.yaml")):
        data = read_yaml(path)
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise UsageError(f"{path}: a framework profile needs a 'name'")
        raw[data["name"]] = (path, data)
    return raw


def validate_framework(data: object, origin: str,
                       catalog: dict[str, tuple[Path, dict]] | None = None) -> FrameworkProfile:
    """A FrameworkProfile from a parsed YAML mapping, ``extends: NAME`` resolved against the
    shipped catalog (chains allowed, cycles refused). UsageError naming the field otherwise."""
    catalog = _framework_raw() if catalog is None else catalog
    seen: list[str] = []
    while isinstance(data, dict) and "extends" in data:
        parent = data["extends"]
        if not isinstance(parent, str) or parent not in catalog:
            names = ", ".join(sorted(catalog))
            raise UsageError(f"{origin}: extends {parent!r}: not a shipped framework profile "
                             f"(one of {names})")
        if parent in seen:
            raise UsageError(f"{origin}: extends forms a cycle through {parent}")
        seen.append(parent)
        try:
            data = merge_extends(data, catalog[parent][1])
        except ValueError as exc:
            raise UsageError(f"{origin}: {exc}") from None
    return validate(FrameworkProfile, data, origin)


def models() -> dict[str, ModelSpec]:
    """All catalog models by name."""
    return _load_all("models")  # type: ignore[return-value]


def hardware_profiles() -> dict[str, HardwareProfile]:
    """All catalog hardware profiles by name."""
    return _load_all("hardware_profiles")  # type: ignore[return-value]


def framework_profiles() -> dict[str, FrameworkProfile]:
    """All catalog framework profiles by name (``extends`` resolved)."""
    return _load_all(FRAMEWORKS)  # type: ignore[return-value]


# what each kind of plan3d input file has at its top level, and where it goes
_KINDS = {
    "plan": (("plan3d_version", "layout"), "use `plan3d estimate --plan {name}` (or export, "
             "validate, placement)"),
    "model": (("num_layers", "hidden_size"), "pass it as --model {name}"),
    "hardware profile": (("gpu", "efficiency"), "pass it as --hardware {name}"),
    "framework profile": (("rules", "runtime"), "pass it as --framework {name}"),
    "validator result": (("checks", "reported"), "plan3d validate wrote it; its plan is "
                         "the one you validated"),
}


def file_kind(data: object) -> str | None:
    """Which kind of plan3d file a parsed YAML/JSON mapping is (plan, model, hardware profile,
    framework profile, validator result), from the keys each kind must have; None if none
    matches."""
    if not isinstance(data, dict):
        return None
    return next((kind for kind, (keys, _) in _KINDS.items() if all(k in data for k in keys)), None)


def refuse_other_kind(data: object, name: str, expected: str) -> None:
    """UsageError when ``data`` (the parsed file ``name``, read as an ``expected`` kind) is
    another kind of plan3d file: say what it is and where it goes, instead of listing the
    fields it lacks."""
    kind = file_kind(data)
    if kind is not None and kind != expected:
        raise UsageError(f"{name} is a {kind} file, not a {expected}; "
                         + _KINDS[kind][1].format(name=name))


def _catalog_names(kind: str) -> dict[str, str]:
    """Lower-case names and aliases of the ``kind`` catalog -> entry name."""
    names: dict[str, str] = {}
    for spec in _load_all(kind).values():
        names[spec.name.lower()] = spec.name
        for alias in spec.aliases:  # type: ignore[attr-defined]
            names[alias.lower()] = spec.name
    return names


def is_bare_name(name: str) -> bool:
    """Whether ``name`` is a catalog name rather than a path: no folder separator and no .yaml,
    .yml or .json ending."""
    return "/" not in name and "\\" not in name and not name.endswith((".yaml", ".yml", ".json"))


def catalog_model_name(name: str) -> str | None:
    """The catalog model that ``name`` names as its name or an alias (case-insensitive), None if
    none does (a path is not looked up)."""
    return _catalog_names("models").get(name.strip().lower())


def _resolve(kind: str, label: str, name: str, cls: type[T]) -> T:
    command = {"models": "models", FRAMEWORKS: "frameworks"}.get(kind, "hardware")
    if not name.strip():  # Path("") is the current directory
        raise UsageError(f"no {label} named (an empty name); see `plan3d {command}` for the list")
    path = Path(name).expanduser()
    bare = is_bare_name(name)
    if bare and path.exists() and name.strip().lower() in (names := _catalog_names(kind)):
        what = "folder" if path.is_dir() else "file"
        canonical = names[name.strip().lower()]
        other = (f"{canonical} for the catalog {label}" if canonical != name.strip() else
                 f"run from another directory for the catalog {label}")
        raise UsageError(f"{name!r} is both a catalog {label} and a {what} here: write ./{name} "
                         f"for the {what}, or {other}")
    if path.is_dir():
        if kind == "models" and (path / "config.json").is_file():  # a Hugging Face model folder
            from .hf_config import load_hf_config
            return load_hf_config(path / "config.json")  # type: ignore[return-value]
        raise UsageError(f"{name} is a directory, not a {label} file")
    if name.endswith((".yaml", ".yml", ".json")) or path.is_file():
        if not path.is_file():
            raise UsageError(f"{label} file not found: {name}")
        if path.suffix == ".json" and kind == "models":  # a Hugging Face config.json
            from .hf_config import load_hf_config
            return load_hf_config(path)  # type: ignore[return-value]
        if path.suffix == ".json":
            raise UsageError(f"{name}: JSON {label} files are not supported yet; write the YAML schema")
        data = read_yaml(path)
        refuse_other_kind(data, name, label)
        if kind == FRAMEWORKS:
            shipped = _framework_raw().get(data.get("name")) if isinstance(data, dict) else None
            if shipped is not None and shipped[0].resolve() != path.resolve():
                raise UsageError(f"{name}: name {data['name']!r} is a shipped framework profile's; "
                                 "give your profile a name of its own (tables and plans would not "
                                 "tell the two apart)")
            return validate_framework(data, str(path))  # type: ignore[return-value]
        return validate(cls, data, str(path))
    entries = _load_all(kind)
    key = name.strip().lower()
    names = _catalog_names(kind)
    if key in names:
        return entries[names[key]]  # type: ignore[return-value]
    close = difflib.get_close_matches(key, list(names), n=5, cutoff=0.5)
    prefix = sorted({names[n] for n in names if n.startswith(key) or key in n})
    suggestions = list(dict.fromkeys([names[c] for c in close] + prefix))[:6]
    hint = f"; did you mean: {', '.join(suggestions)}?" if suggestions else \
        f"; see `plan3d {command}` for the list"
    raise UsageError(f"unknown {label} {name!r}{hint}")


def resolve_model(name: str) -> ModelSpec:
    """A catalog name or alias (case-insensitive), a path to a YAML file of the model schema, or
    a Hugging Face ``config.json`` (planner.hf_config)."""
    return _resolve("models", "model", name, ModelSpec)


def resolve_hardware(name: str) -> HardwareProfile:
    """A catalog name or alias, or a path to a YAML hardware profile."""
    return _resolve("hardware_profiles", "hardware profile", name, HardwareProfile)


DEFAULT_FRAMEWORK = "megatron-core"


def resolve_framework(name: str | None = None) -> FrameworkProfile:
    """A catalog framework profile by name or alias (None: megatron-core, the default), or a
    path to a YAML framework profile (which may ``extends`` a shipped one)."""
    return _resolve(FRAMEWORKS, "framework profile", name or DEFAULT_FRAMEWORK, FrameworkProfile)
