"""Schemas every `/v1` resource shares: list parameters, time ranges, metadata, the error envelope.

Request schemas forbid unknown fields (a typo is a 400 that names it, never silently ignored). Response
schemas describe what the handlers return, for `/v1/openapi.json`; the handlers render their JSON
themselves (a test holds every response to its schema), so no response pays for a second validation.
"""

from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from ninja import Field, Schema
from pydantic import ConfigDict

from kernel.api.validation import query_time

Metadata = Annotated[
    dict[str, str],
    Field(description="Up to 16 string pairs: keys of 1 to 64 characters, values of up to 512."),
]
MetadataPatch = Annotated[
    dict[str, str | None],
    Field(description="Keys to set; a null or empty value deletes the key."),
]
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


# The `type` tags of the request schemas: in a union told apart by `type`, pydantic puts the chosen member's
# tag in an error's field path ('auth.static_bearer.token'); the edge leaves it out ('auth.token'), as the
# client wrote it.
UNION_TAGS: set[str] = set()


class Body(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "type" in cls.model_fields:
            UNION_TAGS.update(t for t in get_args(cls.model_fields["type"].annotation) if isinstance(t, str))

    def given(self) -> dict[str, Any]:
        """The fields the client sent (an update changes only those), as the service's keyword arguments."""
        return {name: getattr(self, name) for name in self.model_fields_set}


_RANGE = "An RFC 3339 time with a zone, e.g. 2026-01-01T00:00:00Z."


class CreatedRange(Schema):
    created_gt: str | None = Field(None, alias="created_at[gt]", description=_RANGE)
    created_gte: str | None = Field(None, alias="created_at[gte]", description=_RANGE)
    created_lt: str | None = Field(None, alias="created_at[lt]", description=_RANGE)
    created_lte: str | None = Field(None, alias="created_at[lte]", description=_RANGE)

    def created_ranges(self) -> dict[str, datetime]:
        """`{op: time}` for the bounds given; a zone's "+" arrives as a space in a query, and is read as one."""
        ranges = {}
        for op in ("gt", "gte", "lt", "lte"):
            raw = getattr(self, f"created_{op}")
            if raw is not None:
                ranges[op] = query_time(raw.replace(" ", "+"), f"created_at[{op}]")
        return ranges


class Empty(Body):
    """No fields: the SDK sends these POSTs with an empty body (`{}`)."""


class Page(Schema):
    page: str | None = Field(None, description="The next_page or prev_page of an earlier response.")


class ErrorDetail(Schema):
    type: str
    message: str
    details: dict[str, Any] | None = None


class ErrorEnvelope(Schema):
    type: Literal["error"]
    error: ErrorDetail


class Deleted(Schema):
    id: str
    type: str


ERRORS: dict[Any, Any] = {frozenset({400, 401, 404, 405, 409, 413, 500, 503}): ErrorEnvelope}
