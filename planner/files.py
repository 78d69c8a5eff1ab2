"""Reading plan3d's input files: YAML that refuses a repeated key, schema validation with one-line
errors, and which kind of plan3d file a mapping is (plan, model, hardware profile, framework
profile, validator result)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import UsageError

T = TypeVar("T", bound=BaseModel)


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
