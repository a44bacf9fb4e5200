"""The AMQP 0-9-1 method set (with RabbitMQ's extensions) and its codec.

Owns: one class per method, generated from the `METHODS` table below, each with a fast decoder and
encoder built once at import time (code generation from the table, so the wire layout is written down
exactly once); `BasicProperties`, the content-header property list; and the frame constants.

Rules:
- `decode_method(payload)` takes a method frame's payload (class id, method id, arguments) and returns a
  method object, raising `FrameError` (501) for a payload that cannot be decoded and `ConnectionError_`
  503 COMMAND_INVALID for an unknown class or method. Nothing else escapes.
- Short strings must be valid UTF-8 (501 otherwise); long strings are kept as bytes.
- Method objects are plain data with `__slots__`; equality compares fields (for tests).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, ClassVar

from .errors import COMMAND_INVALID, ConnectionError_, FrameError
from .table import decode_table, encode_table, remove_table_key

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_HEADER_SIZE = 7
FRAME_OVERHEAD = 8  # 7-byte header + frame-end octet
FRAME_MIN_SIZE = 4096
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

# (class_id, class_name, [(method_id, method_name, [(field, type)], has_content)])
_T = list[tuple[str, str]]
METHODS: list[tuple[int, str, list[tuple[int, str, _T, bool]]]] = [
    (10, "connection", [
        (10, "start", [("version_major", "octet"), ("version_minor", "octet"),
                       ("server_properties", "table"), ("mechanisms", "longstr"),
                       ("locales", "longstr")], False),
        (11, "start_ok", [("client_properties", "table"), ("mechanism", "shortstr"),
                          ("response", "longstr"), ("locale", "shortstr")], False),
        (20, "secure", [("challenge", "longstr")], False),
        (21, "secure_ok", [("response", "longstr")], False),
        (30, "tune", [("channel_max", "short"), ("frame_max", "long"), ("heartbeat", "short")], False),
        (31, "tune_ok", [("channel_max", "short"), ("frame_max", "long"), ("heartbeat", "short")], False),
        (40, "open", [("virtual_host", "shortstr"), ("capabilities", "shortstr"), ("insist", "bit")], False),
        (41, "open_ok", [("known_hosts", "shortstr")], False),
        (50, "close", [("reply_code", "short"), ("reply_text", "shortstr"),
                       ("class_id", "short"), ("method_id", "short")], False),
        (51, "close_ok", [], False),
        (60, "blocked", [("reason", "shortstr")], False),
        (61, "unblocked", [], False),
        (70, "update_secret", [("new_secret", "longstr"), ("reason", "shortstr")], False),
        (71, "update_secret_ok", [], False),
    ]),
    (20, "channel", [
        (10, "open", [("out_of_band", "shortstr")], False),
        (11, "open_ok", [("channel_id", "longstr")], False),
        (20, "flow", [("active", "bit")], False),
        (21, "flow_ok", [("active", "bit")], False),
        (40, "close", [("reply_code", "short"), ("reply_text", "shortstr"),
                       ("class_id", "short"), ("method_id", "short")], False),
        (41, "close_ok", [], False),
    ]),
    (40, "exchange", [
        (10, "declare", [("ticket", "short"), ("exchange", "shortstr"), ("type", "shortstr"),
                         ("passive", "bit"), ("durable", "bit"), ("auto_delete", "bit"),
                         ("internal", "bit"), ("nowait", "bit"), ("arguments", "table")], False),
        (11, "declare_ok", [], False),
        (20, "delete", [("ticket", "short"), ("exchange", "shortstr"), ("if_unused", "bit"),
                        ("nowait", "bit")], False),
        (21, "delete_ok", [], False),
        (30, "bind", [("ticket", "short"), ("destination", "shortstr"), ("source", "shortstr"),
                      ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table")], False),
        (31, "bind_ok", [], False),
        (40, "unbind", [("ticket", "short"), ("destination", "shortstr"), ("source", "shortstr"),
                        ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table")], False),
        (51, "unbind_ok", [], False),
    ]),
    (50, "queue", [
        (10, "declare", [("ticket", "short"), ("queue", "shortstr"), ("passive", "bit"),
                         ("durable", "bit"), ("exclusive", "bit"), ("auto_delete", "bit"),
                         ("nowait", "bit"), ("arguments", "table")], False),
        (11, "declare_ok", [("queue", "shortstr"), ("message_count", "long"),
                            ("consumer_count", "long")], False),
        (20, "bind", [("ticket", "short"), ("queue", "shortstr"), ("exchange", "shortstr"),
                      ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table")], False),
        (21, "bind_ok", [], False),
        (30, "purge", [("ticket", "short"), ("queue", "shortstr"), ("nowait", "bit")], False),
        (31, "purge_ok", [("message_count", "long")], False),
        (40, "delete", [("ticket", "short"), ("queue", "shortstr"), ("if_unused", "bit"),
                        ("if_empty", "bit"), ("nowait", "bit")], False),
        (41, "delete_ok", [("message_count", "long")], False),
        (50, "unbind", [("ticket", "short"), ("queue", "shortstr"), ("exchange", "shortstr"),
                        ("routing_key", "shortstr"), ("arguments", "table")], False),
        (51, "unbind_ok", [], False),
    ]),
    (60, "basic", [
        (10, "qos", [("prefetch_size", "long"), ("prefetch_count", "short"), ("global_", "bit")], False),
        (11, "qos_ok", [], False),
        (20, "consume", [("ticket", "short"), ("queue", "shortstr"), ("consumer_tag", "shortstr"),
                         ("no_local", "bit"), ("no_ack", "bit"), ("exclusive", "bit"),
                         ("nowait", "bit"), ("arguments", "table")], False),
        (21, "consume_ok", [("consumer_tag", "shortstr")], False),
        (30, "cancel", [("consumer_tag", "shortstr"), ("nowait", "bit")], False),
        (31, "cancel_ok", [("consumer_tag", "shortstr")], False),
        (40, "publish", [("ticket", "short"), ("exchange", "shortstr"), ("routing_key", "shortstr"),
                         ("mandatory", "bit"), ("immediate", "bit")], True),
        (50, "return_", [("reply_code", "short"), ("reply_text", "shortstr"), ("exchange", "shortstr"),
                         ("routing_key", "shortstr")], True),
        (60, "deliver", [("consumer_tag", "shortstr"), ("delivery_tag", "longlong"),
                         ("redelivered", "bit"), ("exchange", "shortstr"),
                         ("routing_key", "shortstr")], True),
        (70, "get", [("ticket", "short"), ("queue", "shortstr"), ("no_ack", "bit")], False),
        (71, "get_ok", [("delivery_tag", "longlong"), ("redelivered", "bit"), ("exchange", "shortstr"),
                        ("routing_key", "shortstr"), ("message_count", "long")], True),
        (72, "get_empty", [("cluster_id", "shortstr")], False),
        (80, "ack", [("delivery_tag", "longlong"), ("multiple", "bit")], False),
        (90, "reject", [("delivery_tag", "longlong"), ("requeue", "bit")], False),
        (100, "recover_async", [("requeue", "bit")], False),
        (110, "recover", [("requeue", "bit")], False),
        (111, "recover_ok", [], False),
        (120, "nack", [("delivery_tag", "longlong"), ("multiple", "bit"), ("requeue", "bit")], False),
    ]),
    (85, "confirm", [
        (10, "select", [("nowait", "bit")], False),
        (11, "select_ok", [], False),
    ]),
    (90, "tx", [
        (10, "select", [], False),
        (11, "select_ok", [], False),
        (20, "commit", [], False),
        (21, "commit_ok", [], False),
        (30, "rollback", [], False),
        (31, "rollback_ok", [], False),
    ]),
]

_DEFAULTS = {"octet": 0, "short": 0, "long": 0, "longlong": 0, "timestamp": 0, "bit": False,
             "shortstr": "", "longstr": b"", "table": None}
_FIXED = {"octet": "B", "short": "H", "long": "I", "longlong": "Q", "timestamp": "Q"}


def _sstr(buf: Any, o: int) -> tuple[str, int]:
    n = buf[o]
    o += 1
    end = o + n
    if end > len(buf):
        raise FrameError("short string overruns its frame")
    try:
        return bytes(buf[o:end]).decode("utf-8"), end
    except UnicodeDecodeError:
        raise FrameError("short string is not valid UTF-8") from None


def _lstr(buf: Any, o: int) -> tuple[bytes, int]:
    (n,) = struct.unpack_from(">I", buf, o)
    o += 4
    end = o + n
    if end > len(buf):
        raise FrameError("long string overruns its frame")
    return bytes(buf[o:end]), end


def _enc_sstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise ValueError(f"short string too long ({len(raw)} bytes)")
    return bytes((len(raw),)) + raw


def _enc_lstr(value: bytes | str) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return struct.pack(">I", len(raw)) + raw


class Method:
    """Base of all generated method classes."""

    __slots__ = ()
    CLASS_ID: ClassVar[int]
    METHOD_ID: ClassVar[int]
    INDEX: ClassVar[int]
    NAME: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    HAS_CONTENT: ClassVar[bool]

    def encode(self) -> bytes:  # replaced per class
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, f) == getattr(other, f) for f in self.FIELDS
        )

    def __hash__(self) -> int:
        return hash((self.INDEX,))

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS)
        return f"<{self.NAME}({args})>"


def _gen_decoder(fields: list[tuple[str, str]]) -> list[str]:
    """Source lines of a decoder body: `buf`, offset `o` (after class/method ids) -> values f0..fn."""
    lines: list[str] = []
    i = 0
    n = len(fields)
    while i < n:
        name, kind = fields[i]
        if kind in _FIXED:
            j = i
            fmt = ""
            while j < n and fields[j][1] in _FIXED:
                fmt += _FIXED[fields[j][1]]
                j += 1
            names = ", ".join(f"f{k}" for k in range(i, j))
            lines.append(f"{names}, = _unpack('>{fmt}', buf, o); o += {struct.calcsize('>' + fmt)}")
            i = j
        elif kind == "bit":
            j = i
            while j < n and fields[j][1] == "bit":
                j += 1
            lines.append("bits = buf[o]; o += 1")
            for k in range(i, j):
                lines.append(f"f{k} = (bits & {1 << (k - i)}) != 0")
            i = j
        elif kind == "shortstr":
            lines.append(f"f{i}, o = _sstr(buf, o)")
            i += 1
        elif kind == "longstr":
            lines.append(f"f{i}, o = _lstr(buf, o)")
            i += 1
        elif kind == "table":
            lines.append(f"f{i}, o = _dtable(buf, o)")
            i += 1
        else:  # pragma: no cover - table typo
            raise AssertionError(kind)
    return lines


def _gen_encoder(fields: list[tuple[str, str]]) -> list[str]:
    lines: list[str] = []
    i = 0
    n = len(fields)
    while i < n:
        name, kind = fields[i]
        if kind in _FIXED:
            j = i
            fmt = ""
            while j < n and fields[j][1] in _FIXED:
                fmt += _FIXED[fields[j][1]]
                j += 1
            args = ", ".join(f"self.{fields[k][0]}" for k in range(i, j))
            lines.append(f"parts.append(_pack('>{fmt}', {args}))")
            i = j
        elif kind == "bit":
            j = i
            while j < n and fields[j][1] == "bit":
                j += 1
            expr = " | ".join(f"({1 << (k - i)} if self.{fields[k][0]} else 0)" for k in range(i, j))
            lines.append(f"parts.append(bytes(({expr},)))")
            i = j
        elif kind == "shortstr":
            lines.append(f"parts.append(_enc_sstr(self.{name}))")
            i += 1
        elif kind == "longstr":
            lines.append(f"parts.append(_enc_lstr(self.{name}))")
            i += 1
        elif kind == "table":
            lines.append(f"parts.append(_etable(self.{name}))")
            i += 1
    return lines


_NAMESPACE: dict[str, Any] = {
    "_unpack": struct.unpack_from, "_pack": struct.pack, "_sstr": _sstr, "_lstr": _lstr,
    "_dtable": decode_table, "_etable": encode_table, "_enc_sstr": _enc_sstr, "_enc_lstr": _enc_lstr,
    "FrameError": FrameError, "struct": struct,
}


# a generated method decoder: (frame payload, offset of the arguments) -> the method
MethodDecoder = Callable[[bytes | memoryview, int], Method]


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.strip("_").split("_"))


def _build_class(class_id: int, class_name: str, method_id: int, method_name: str,
                 fields: list[tuple[str, str]], has_content: bool) -> tuple[type[Method], MethodDecoder]:
    field_names = tuple(f for f, _ in fields)
    params = ", ".join(f"{f}={_DEFAULTS[k]!r}" for f, k in fields)
    init_body = [f"    self.{f} = {f}" for f in field_names] or ["    pass"]
    init_src = f"def __init__(self{', ' if params else ''}{params}):\n" + "\n".join(init_body)
    header = struct.pack(">HH", class_id, method_id)
    enc = _gen_encoder(fields)
    enc_src = "def encode(self):\n    parts = [_header]\n" + "".join(f"    {ln}\n" for ln in enc)
    enc_src += "    return b''.join(parts)\n"
    dec = _gen_decoder(fields)
    args = ", ".join(f"f{k}" for k in range(len(fields)))
    dec_src = "def decode(buf, o):\n    try:\n" + "".join(f"        {ln}\n" for ln in dec or ["pass"])
    dec_src += "    except (IndexError, struct.error):\n"
    dec_src += f"        raise FrameError('cannot decode {class_name}.{method_name}') from None\n"
    dec_src += f"    return _cls({args})\n"
    ns = dict(_NAMESPACE, _header=header)
    exec(init_src, ns)  # noqa: S102 - code generated from the METHODS table above
    exec(enc_src, ns)  # noqa: S102
    cls = type(
        _camel(class_name) + _camel(method_name),
        (Method,),
        {
            "__slots__": field_names,
            "__init__": ns["__init__"],
            "encode": ns["encode"],
            "CLASS_ID": class_id,
            "METHOD_ID": method_id,
            "INDEX": (class_id << 16) | method_id,
            "NAME": f"{class_name}.{method_name.rstrip('_')}",
            "FIELDS": field_names,
            "HAS_CONTENT": has_content,
        },
    )
    ns["_cls"] = cls
    exec(dec_src, ns)  # noqa: S102
    return cls, ns["decode"]


METHOD_CLASSES: dict[int, type[Method]] = {}
_DECODERS: dict[int, MethodDecoder] = {}
CLASS_NAMES: dict[int, str] = {}


class _Namespace:
    """Attribute access to method classes: `spec.Basic.Publish`."""


def _build_all() -> dict[str, _Namespace]:
    namespaces: dict[str, _Namespace] = {}
    for class_id, class_name, methods in METHODS:
        CLASS_NAMES[class_id] = class_name
        ns = _Namespace()
        for method_id, method_name, fields, has_content in methods:
            cls, decoder = _build_class(class_id, class_name, method_id, method_name, fields, has_content)
            METHOD_CLASSES[cls.INDEX] = cls
            _DECODERS[cls.INDEX] = decoder
            setattr(ns, _camel(method_name), cls)
        namespaces[class_name] = ns
    return namespaces


_ns = _build_all()
Connection: Any = _ns["connection"]
Channel: Any = _ns["channel"]
Exchange: Any = _ns["exchange"]
Queue: Any = _ns["queue"]
Basic: Any = _ns["basic"]
Confirm: Any = _ns["confirm"]
Tx: Any = _ns["tx"]


def method_name(class_id: int, method_id: int) -> str:
    cls = METHOD_CLASSES.get((class_id << 16) | method_id)
    return cls.NAME if cls else f"{class_id}.{method_id}"


def decode_method(payload: bytes | memoryview) -> Method:
    """Decode a method frame payload. Raises FrameError (501) or ConnectionError_ (503)."""
    if len(payload) < 4:
        raise FrameError("method frame too short")
    index = (payload[0] << 24) | (payload[1] << 16) | (payload[2] << 8) | payload[3]
    decoder = _DECODERS.get(index)
    if decoder is None:
        raise ConnectionError_(COMMAND_INVALID, f"unknown method {index >> 16}.{index & 0xFFFF}",
                               index >> 16, index & 0xFFFF)
    return decoder(payload, 4)


# ---------------------------------------------------------------------------------------------------
# Content header properties (class basic)

PROPERTY_FIELDS: tuple[tuple[str, str], ...] = (
    ("content_type", "shortstr"),
    ("content_encoding", "shortstr"),
    ("headers", "table"),
    ("delivery_mode", "octet"),
    ("priority", "octet"),
    ("correlation_id", "shortstr"),
    ("reply_to", "shortstr"),
    ("expiration", "shortstr"),
    ("message_id", "shortstr"),
    ("timestamp", "timestamp"),
    ("type", "shortstr"),
    ("user_id", "shortstr"),
    ("app_id", "shortstr"),
    ("cluster_id", "shortstr"),
)
PROPERTY_NAMES = tuple(n for n, _ in PROPERTY_FIELDS)
_PROP_FLAG = {name: 1 << (15 - i) for i, name in enumerate(PROPERTY_NAMES)}
FLAG_HEADERS = _PROP_FLAG["headers"]
FLAG_DELIVERY_MODE = _PROP_FLAG["delivery_mode"]
FLAG_PRIORITY = _PROP_FLAG["priority"]
FLAG_EXPIRATION = _PROP_FLAG["expiration"]
FLAG_USER_ID = _PROP_FLAG["user_id"]
FLAG_REPLY_TO = _PROP_FLAG["reply_to"]
FLAG_TIMESTAMP = _PROP_FLAG["timestamp"]


class BasicProperties:
    """The 14 basic content properties; None means absent."""

    __slots__ = PROPERTY_NAMES
    content_type: str | None
    content_encoding: str | None
    headers: dict[str, Any] | None
    delivery_mode: int | None
    priority: int | None
    correlation_id: str | None
    reply_to: str | None
    expiration: str | None
    message_id: str | None
    timestamp: int | None
    type: str | None
    user_id: str | None
    app_id: str | None
    cluster_id: str | None

    def __init__(self, **kwargs: Any) -> None:
        for name in PROPERTY_NAMES:
            setattr(self, name, kwargs.pop(name, None))
        if kwargs:
            raise TypeError(f"unknown properties: {sorted(kwargs)}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BasicProperties) and all(
            getattr(self, n) == getattr(other, n) for n in PROPERTY_NAMES
        )

    def __repr__(self) -> str:
        present = ", ".join(f"{n}={getattr(self, n)!r}" for n in PROPERTY_NAMES if getattr(self, n) is not None)
        return f"BasicProperties({present})"

    def copy(self) -> BasicProperties:
        new = BasicProperties.__new__(BasicProperties)
        for n in PROPERTY_NAMES:
            setattr(new, n, getattr(self, n))
        return new

    def to_dict(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in PROPERTY_NAMES if getattr(self, n) is not None}

    def encode(self) -> bytes:
        """Encode the flags and property list (the header frame after class, weight and body size)."""
        flags = 0
        parts: list[bytes] = []
        for i, (name, kind) in enumerate(PROPERTY_FIELDS):
            value = getattr(self, name)
            if value is None:
                continue
            flags |= 1 << (15 - i)
            if kind == "shortstr":
                parts.append(_enc_sstr(value))
            elif kind == "table":
                parts.append(encode_table(value))
            elif kind == "octet":
                parts.append(bytes((value,)))
            else:
                parts.append(struct.pack(">Q", value))
        return struct.pack(">H", flags) + b"".join(parts)

    @classmethod
    def decode(cls, buf: bytes | memoryview, offset: int) -> BasicProperties:
        """Decode flags + property list starting at `offset`. Raises FrameError."""
        return _decode_properties(buf, offset)


def _gen_properties_decoder() -> Callable[[bytes | memoryview, int], BasicProperties]:
    """Straight-line decoder generated from PROPERTY_FIELDS (no per-field loop or setattr by name)."""
    lines = [
        "def decode(buf, o):",
        "    props = _new(_cls)",
        "    try:",
        "        flags = (buf[o] << 8) | buf[o + 1]",
        "        o += 2",
        "        if flags & 1:",
        "            raise FrameError('property flags continuation is not supported for class basic')",
    ]
    for i, (name, kind) in enumerate(PROPERTY_FIELDS):
        bit = 1 << (15 - i)
        lines.append(f"        if flags & {bit}:")
        if kind == "shortstr":
            lines.append(f"            props.{name}, o = _sstr(buf, o)")
        elif kind == "table":
            lines.append(f"            props.{name}, o = _dtable(buf, o)")
        elif kind == "octet":
            lines.append(f"            props.{name} = buf[o]")
            lines.append("            o += 1")
        else:
            lines.append(f"            props.{name} = _unpack('>Q', buf, o)[0]")
            lines.append("            o += 8")
        lines.append("        else:")
        lines.append(f"            props.{name} = None")
    lines += [
        "    except (IndexError, struct.error):",
        "        raise FrameError('cannot decode content header properties') from None",
        "    if o > len(buf):",
        "        raise FrameError('content header properties overrun the frame')",
        "    return props",
    ]
    ns = dict(_NAMESPACE, _new=object.__new__, _cls=BasicProperties)
    exec("\n".join(lines), ns)  # noqa: S102 - generated from the PROPERTY_FIELDS table
    decode: Callable[[bytes | memoryview, int], BasicProperties] = ns["decode"]
    return decode


_decode_properties = _gen_properties_decoder()


EMPTY_PROPERTIES_RAW = b"\x00\x00"


def remove_header(properties_raw: bytes, key: str) -> bytes:
    """The encoded property list with one key removed from its headers table, all else byte-exact."""
    flags = (properties_raw[0] << 8) | properties_raw[1]
    if not flags & FLAG_HEADERS:
        return properties_raw
    offset = 2
    for name in ("content_type", "content_encoding"):
        if flags & _PROP_FLAG[name]:
            offset += 1 + properties_raw[offset]
    (length,) = struct.unpack_from(">I", properties_raw, offset)
    end = offset + 4 + length
    return properties_raw[:offset] + remove_table_key(properties_raw, offset, key) + properties_raw[end:]
