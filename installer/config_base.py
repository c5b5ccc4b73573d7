"""What the blocks of the site model (installer.config) are built from: the strict base model, version text as
YAML gives it, a field's JSON-schema rules, and the image override several blocks share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from installer.patterns import DIGEST, PATH_COMPONENT, REPOSITORY, TAG, image_tag, repository_ref


def _version_text(v: Any) -> Any:
    """A version field given as a YAML number: an integer (550) is taken as written; a float is refused, because
    YAML has already turned 20.10 into 20.1 and 1.30 into 1.3."""
    if isinstance(v, bool):
        raise ValueError("must be a version string, not true/false")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        raise ValueError(f"is a YAML number ({v!r}), which drops trailing zeros (20.10 becomes 20.1): "
                         "quote the version, e.g. '20.10'")
    return v


#: A version or tag written in YAML: "550" and 550 are the same; 20.10 unquoted is refused ("quote it").
VersionText = Annotated[str, BeforeValidator(_version_text)]


def rules(string: dict[str, Any] | None = None, integer: dict[str, Any] | None = None,
          **extra: Any) -> Callable[[dict[str, Any]], None]:
    """json_schema_extra for a field: `string` constraints go on the field's string branch (also inside anyOf with
    null), `integer` adds an integer branch (a VersionText field takes 550 as "550"), `extra` goes on the field."""

    def edit(schema: dict[str, Any]) -> None:
        branches = schema.get("anyOf", [schema])
        for b in branches:
            if b.get("type") == "string" and string:
                b.update(string)
        if integer is not None:
            if "anyOf" not in schema:
                schema["anyOf"] = [{k: schema.pop(k) for k in list(schema) if k in ("type", "pattern", "maxLength")}]
            schema["anyOf"].insert(1, {"type": "integer", **integer})
        schema.update(extra)

    return edit


class Block(BaseModel):
    """A block of the site file: unknown fields refused, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ImageOverride(Block):
    version: VersionText | None = Field(None, description="image tag or sha256 digest", json_schema_extra=rules(
        {"pattern": rf"^(?:{TAG}|{DIGEST})$"}, integer={"minimum": 0}))
    repository: str | None = Field(None, description="upstream source repository (mapped by registry.layout)",
                                   json_schema_extra=rules({"pattern": REPOSITORY, "maxLength": 255}))
    image: str | None = Field(None, description="image name inside the repository", pattern=rf"^{PATH_COMPONENT}$",
                              json_schema_extra=rules({"pattern": rf"^{PATH_COMPONENT}$"}))

    @field_validator("version")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        return None if v is None else image_tag(v)

    @field_validator("repository")
    @classmethod
    def _repository(cls, v: str | None) -> str | None:
        return None if v is None else repository_ref(v)
