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

from pydantic import BaseModel

from .errors import UsageError
from .files import read_yaml, refuse_other_kind, validate
from .framework_spec import FrameworkProfile, merge_extends
from .hf_config import load_hf_config
from .specs import HardwareProfile, ModelSpec

T = TypeVar("T", bound=BaseModel)

_PACKAGE_DIR = Path(__file__).resolve().parent


def catalog_dir(kind: str) -> Path:
    """Directory of a catalog (``models`` or ``hardware_profiles``): the wheel's copy, else the repo's."""
    for candidate in (_PACKAGE_DIR / "_catalog" / kind, _PACKAGE_DIR.parent / kind):
        if candidate.is_dir():
            return candidate
    raise UsageError(f"the {kind} catalog is missing from this installation")


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
            return load_hf_config(path / "config.json")  # type: ignore[return-value]
        raise UsageError(f"{name} is a directory, not a {label} file")
    if name.endswith((".yaml", ".yml", ".json")) or path.is_file():
        if not path.is_file():
            raise UsageError(f"{label} file not found: {name}")
        if path.suffix == ".json" and kind == "models":  # a Hugging Face config.json
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
