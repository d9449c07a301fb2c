"""The JSON shapes of request bodies, checked at the edge: a field of the wrong JSON type
is a 400 that names it (``messages[2].content``), never an exception deeper in.

A ``Shape`` says which JSON types a value may have and, for arrays and objects, what they
hold. Objects list the members the gateway knows; members it does not know pass through
unchecked (vLLM and the providers take many extensions, and check them themselves).
Checking walks the body's own members, not the schema's, so a body of a few fields costs
a few dictionary look-ups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gateway.errors import InvalidRequest
from gateway.routing.token_ids import TokenIds


class Kind(StrEnum):
    """The JSON types (integers apart: they are numbers, but not every number is one)."""

    NULL = "null"
    BOOLEAN = "boolean"
    INTEGER = "integer"
    NUMBER = "number"
    STRING = "string"
    ARRAY = "array"
    OBJECT = "object"


_KINDS: dict[type, Kind] = {
    type(None): Kind.NULL,
    bool: Kind.BOOLEAN,
    int: Kind.INTEGER,
    float: Kind.NUMBER,
    str: Kind.STRING,
    list: Kind.ARRAY,
    dict: Kind.OBJECT,
    # A large body's prompt of token ids, read compactly (gateway/api/token_ids.py) and
    # checked there: an array that needs nothing more.
    TokenIds: Kind.ARRAY,
}


def kind_of(value: Any) -> Kind:
    """The JSON type of a value as orjson reads it."""
    return _KINDS[type(value)]


@dataclass(frozen=True, slots=True)
class Shape:
    """What one JSON value may be."""

    kinds: frozenset[Kind]
    what: str  # said in the error: "a string or null"
    items: Shape | None = None  # an array's elements
    fields: Mapping[str, Shape] = field(default_factory=dict)  # an object's known members
    required: frozenset[str] = frozenset()
    values: Shape | None = None  # every member of an object that is a map
    min_items: int = 0
    uniform: bool = False  # an array's elements all of one JSON type
    minimum: float | None = None
    maximum: float | None = None
    choices: frozenset[str] = frozenset()  # a string's allowed values (empty: any)
    # An object whose members depend on one of them (a message's on its role): the
    # variant named by that member's value, this shape itself when it names none.
    variant_of: str = ""
    variants: Mapping[str, Shape] = field(default_factory=dict)
    # Derived, for the hot path: the Python types accepted, and those of them that need
    # nothing more (a string with no choices, a boolean, an object with nothing listed).
    types: frozenset[type] = field(init=False, repr=False, compare=False)
    done: frozenset[type] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        accepted = {t for t, kind in _KINDS.items() if self.accepts(kind)}
        unbounded = self.minimum is None and self.maximum is None
        needs_more = {
            str: bool(self.choices),
            int: not unbounded,
            float: not unbounded,
            list: self.items is not None or self.min_items > 0,
            dict: bool(self.fields or self.values or self.required or self.variants),
        }
        done = {t for t in accepted if not needs_more.get(t, False)}
        object.__setattr__(self, "types", frozenset(accepted))
        object.__setattr__(self, "done", frozenset(done))

    def accepts(self, kind: Kind) -> bool:
        """Whether a value of ``kind`` fits; an integer fits where a number may be."""
        return kind in self.kinds or (kind is Kind.INTEGER and Kind.NUMBER in self.kinds)


def string(*choices: str) -> Shape:
    """The shape of a JSON string; with ``choices``, only one of them."""
    if not choices:
        return Shape(frozenset({Kind.STRING}), "a string")
    listed = ", ".join(f"'{c}'" for c in choices)
    return Shape(frozenset({Kind.STRING}), f"one of {listed}", choices=frozenset(choices))


def boolean() -> Shape:
    """The shape of a JSON boolean."""
    return Shape(frozenset({Kind.BOOLEAN}), "a boolean")


def number() -> Shape:
    """The shape of a JSON number, an integer included."""
    return Shape(frozenset({Kind.NUMBER}), "a number")


def integer(minimum: int | None = None, maximum: int | None = None) -> Shape:
    """The shape of a JSON integer, within ``minimum``..``maximum`` where given."""
    what = "an integer"
    if minimum is not None and maximum is not None:
        what = f"an integer between {minimum} and {maximum}"
    return Shape(frozenset({Kind.INTEGER}), what, minimum=minimum, maximum=maximum)


def array(items: Shape, what: str, *, min_items: int = 0, uniform: bool = False) -> Shape:
    """An array of ``items``, at least ``min_items`` long (``uniform``: all of one JSON type)."""
    return Shape(frozenset({Kind.ARRAY}), what, items=items, min_items=min_items, uniform=uniform)


def obj(fields: Mapping[str, Shape], *, required: tuple[str, ...] = (), what: str = "") -> Shape:
    """The shape of a JSON object with these ``fields``, the ``required`` ones present."""
    return Shape(
        frozenset({Kind.OBJECT}),
        what or "an object",
        fields=dict(fields),
        required=frozenset(required),
    )


def variants(base: Shape, member: str, by_value: Mapping[str, Shape]) -> Shape:
    """An object checked as ``by_value[its member's value]``, or as ``base`` otherwise."""
    return Shape(**{**_fields(base), "variant_of": member, "variants": dict(by_value)})


def mapping(values: Shape, what: str) -> Shape:
    """An object used as a map: any member names, every value of one shape."""
    return Shape(frozenset({Kind.OBJECT}), what, values=values)


def either(*shapes: Shape, what: str) -> Shape:
    """Any of the shapes; at most one of them an array and one an object."""
    kinds: set[Kind] = set()
    merged: dict[str, Any] = {}
    for shape in shapes:
        if shape.kinds & kinds & {Kind.ARRAY, Kind.OBJECT}:
            raise ValueError("either() takes one array shape and one object shape at most")
        kinds |= shape.kinds
        if Kind.ARRAY in shape.kinds:
            merged.update(items=shape.items, min_items=shape.min_items, uniform=shape.uniform)
        if Kind.OBJECT in shape.kinds:
            merged.update(
                fields=shape.fields,
                required=shape.required,
                values=shape.values,
                variant_of=shape.variant_of,
                variants=shape.variants,
            )
        if Kind.STRING in shape.kinds and shape.choices:
            merged.update(choices=shape.choices)
        if shape.kinds & {Kind.INTEGER, Kind.NUMBER}:
            merged.update(minimum=shape.minimum, maximum=shape.maximum)
    return Shape(frozenset(kinds), what, **merged)


def nullable(shape: Shape) -> Shape:
    """The shape, or null (how OpenAI's API says "not given" for most options)."""
    return Shape(**{**_fields(shape), "kinds": shape.kinds | {Kind.NULL}})


def _fields(shape: Shape) -> dict[str, Any]:
    return {name: getattr(shape, name) for name, f in Shape.__dataclass_fields__.items() if f.init}


class _Fault(Exception):
    """A value not of its shape: the steps to it (innermost first), said once caught."""

    def __init__(self, what: str, required: bool = False, steps: list[str | int] | None = None):
        self.what, self.required, self.steps = what, required, steps or []


def check(shape: Shape, value: Any) -> None:
    """Raise InvalidRequest naming the first value (depth first) that is not its shape."""
    try:
        _check(shape, value)
    except _Fault as fault:
        path = ""
        for step in reversed(fault.steps):
            path += f"[{step}]" if isinstance(step, int) else (f".{step}" if path else step)
        said = "is required and must be" if fault.required else "must be"
        raise InvalidRequest(f"'{path}' {said} {fault.what}", param=path or None) from None


def _check(shape: Shape, value: Any, required: bool = False) -> None:
    kind = type(value)
    if kind in shape.done:
        return
    if kind not in shape.types:
        raise _Fault(shape.what, required)
    if kind is dict:
        _check_object(shape, value)
    elif kind is list:
        _check_array(shape, value)
    elif kind is str:
        if value not in shape.choices:
            raise _Fault(shape.what)
    elif kind is int or kind is float:
        low = shape.minimum if shape.minimum is not None else value
        high = shape.maximum if shape.maximum is not None else value
        if not low <= value <= high:
            raise _Fault(shape.what)


def variant(shape: Shape, value: dict[str, Any]) -> Shape:
    """The shape an object is checked as (its variant, if its shape has them)."""
    if shape.variant_of:
        tag = value.get(shape.variant_of)
        if isinstance(tag, str):
            return shape.variants.get(tag, shape)
    return shape


def _check_object(shape: Shape, value: dict[str, Any]) -> None:
    if shape.variant_of:
        shape = variant(shape, value)
    required = shape.required
    for name in required:
        if name not in value:
            raise _Fault(shape.fields[name].what, True, [name])
    fields, values = shape.fields, shape.values
    for name, member in value.items():
        inner = fields.get(name, values)
        # Most members need a type look-up only: done here, without a call each.
        if inner is not None and type(member) not in inner.done:
            try:
                _check(inner, member, name in required)
            except _Fault as fault:
                fault.steps.append(name)
                raise


def _check_array(shape: Shape, value: list[Any]) -> None:
    if len(value) < shape.min_items:
        raise _Fault(shape.what)
    items = shape.items
    if items is None:
        return
    done = items.done
    for index, item in enumerate(value):
        if type(item) not in done:
            try:
                _check(items, item)
            except _Fault as fault:
                fault.steps.append(index)
                raise
    if shape.uniform and len({type(v) for v in value}) > 1:
        raise _Fault(shape.what)


def paths(shape: Shape, path: str = "") -> list[str]:
    """Every position a shape names (array elements as ``[]``): for tests and docs."""
    found = [path] if path else []
    for inner in shape.variants.values():
        found += [p for p in paths(inner, path) if p not in found]
    if shape.items is not None:
        found += paths(shape.items, path + "[]")
    prefix = path + "." if path else ""
    for name, inner in shape.fields.items():
        found += paths(inner, prefix + name)
    if shape.values is not None:
        found += paths(shape.values, prefix + "*")
    return found
