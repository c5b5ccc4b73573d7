"""Reading a small file the user named (a site file, a CA, a metrics CSV, a pins file): a regular file of bounded
size, UTF-8 text, YAML without the mistakes YAML forgives; anything else is a ConfigError (exit 2) naming the path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from installer.errors import ConfigError

MAX_INPUT_BYTES = 1 << 20  # a site file is a few KB; anything near a megabyte is a mistake (or /dev/zero)


def read_text(path: Path, what: str = "file", limit: int = MAX_INPUT_BYTES) -> str:
    """A small regular text file's content, or ConfigError naming the path: never blocks on a FIFO or a device,
    never reads without bound, never follows a symlink loop into a traceback."""
    import stat

    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} not found", hint="check the path") from None
    except OSError as exc:  # ELOOP (a symlink loop), EACCES, ENAMETOOLONG, …
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}", hint="check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {path} is a directory", hint="give the file itself")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {path} is not a regular file (a device, FIFO or socket)", hint="give a file")
    if st.st_size > limit:
        raise ConfigError(f"{what} {path} is {st.st_size} bytes; more than {limit} is not a {what}",
                          hint="check the path")
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise ConfigError(f"{what} {path} grew past {limit} bytes while being read", hint="check the path")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {exc.start})", hint="save it as UTF-8") from None


def shipped_yaml(text: str) -> Any:
    """YAML the package ships (the release catalog, MIG models, platforms, alert rules): yaml.safe_load's semantics,
    with libyaml's parser when PyYAML was built with it (a catalog release file is most of a cold `render`'s parse
    time). What a user, bundle or node gives goes through parse_yaml (duplicate keys refused, errors with a line)."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def read_yaml(path: Path, what: str = "file") -> Any:
    return parse_yaml(read_text(path, what), str(path))


def parse_yaml(text: str, where: str, *, aliases: bool = True) -> Any:
    """YAML with the mistakes YAML itself forgives refused: a key given twice in one mapping (both lines named),
    nesting deep enough to exhaust the parser. aliases=False (YAML someone else wrote, read for a few fields: a
    Chart.yaml) refuses any alias (*name, a << merge) where it appears, before anything is built: a "billion laughs"
    document stays the size of its text."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if not aliases and self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ConfigError(f"{where}:{mark.line + 1}:{mark.column + 1}: a YAML alias (*name), which this file "
                                  "has no use for: refused", hint="write the value out instead of referring to it")
            return super().compose_node(parent, index)

    def mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: let the constructor say so
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise ConfigError(f"{where}:{line}: key {key!r} is given twice (first at line {first})",
                                  hint="YAML would keep only the last one: remove one of them")
            seen[key] = line
        return loader.construct_mapping(node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{at}: invalid YAML: {problem}", hint="fix the YAML syntax at that position") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a site file", hint="check the file") from None


MAX_JSON_DEPTH = 64  # what gpu-install writes nests a dozen levels at most (Helm values inside a plan)


def json_value(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON text as Python values, strictly: ValueError saying what is wrong (never a RecursionError traceback) for
    text that is not UTF-8 JSON, nests more than max_depth arrays/objects, gives a key twice in one object (json
    would keep the last one), or uses NaN/Infinity."""
    import json

    class Twice(ValueError):
        pass

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise Twice(f"key {key!r} is given twice in one object (JSON readers disagree on which one counts)")
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        doc = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except RecursionError:
        raise ValueError(f"nested more than {max_depth} levels deep") from None
    except Twice as exc:
        raise ValueError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    # the depth of what parsed, without recursion: (value, its depth) pairs on an explicit stack
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        if depth > max_depth:
            raise ValueError(f"nested more than {max_depth} levels deep")
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return doc


def parse_json(text: str | bytes, where: str, *, hint: str | None = None, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json_value's document, or ConfigError (exit 2) '<where>: <what is wrong>' with hint as the fix."""
    try:
        return json_value(text, max_depth)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}", hint=hint or "give the file as gpu-install wrote it") from None


def read_json(path: Path, what: str = "file", limit: int = MAX_INPUT_BYTES, *, hint: str | None = None,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON file the user gave or gpu-install wrote and reads back (a plan, a state record, a report): read_text's
    bounds (a regular file of at most limit bytes, UTF-8), then parse_json's (depth, duplicate keys), every refusal
    a ConfigError (exit 2) '<what> <path>: …'."""
    return parse_json(read_text(path, what, limit), f"{what} {path}", hint=hint, max_depth=max_depth)
