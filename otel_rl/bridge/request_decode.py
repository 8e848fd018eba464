"""A received body to an OTLP request message: inflated within a bound, counted before it is
decoded (:mod:`otel_rl.bridge.limits`, :mod:`otel_rl.bridge.json_scan`), queue space reserved
for it, then decoded. Every step is bounded by the body's counts, so one request costs bounded
memory and time whatever it holds."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from otel_rl.bridge.json_scan import scan_json
from otel_rl.bridge.limits import Counts, Malformed, RequestLimits, RequestTooBig, scan_otlp

__all__ = ["MAX_BODY_BYTES", "MAX_JSON_BODY_BYTES", "BadRequest", "QueueFull", "decode_request", "inflate"]

MAX_BODY_BYTES = 20 << 20  # on the wire and after decompression: the collector's OTLP receiver default (confighttp)
MAX_JSON_BODY_BYTES = 8 << 20  # OTLP/JSON after decompression (counted before it is parsed, too)


class QueueFull(Exception):
    """The request queue has no room for the request (answered 503 with Retry-After)."""


class BadRequest(Exception):
    """A request answered with a 4xx ``status`` and a ``google.rpc.Status`` saying why."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def inflate(body: bytes, encoding: str, most: int) -> bytes | bytearray:
    """``body`` decompressed per its Content-Encoding, at most ``most`` bytes (413 past it).

    Inflated a megabyte at a time into one growing buffer: zlib's one-shot output is built in
    blocks and joined, which holds the body twice at its peak."""
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS
    else:
        raise BadRequest(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"unsupported Content-Encoding {encoding!r}: use gzip, deflate or none")
    out = bytearray()
    try:
        inflater = zlib.decompressobj(wbits)
        pending: bytes = body
        while pending and not inflater.eof:
            out += inflater.decompress(pending, 1 << 20)
            pending = inflater.unconsumed_tail
            if len(out) > most:
                break
        if not inflater.eof and len(out) <= most:
            out += inflater.flush()
    except zlib.error as exc:
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"body is not valid {encoding}: {exc}") from None
    if len(out) > most:
        del out  # not held by the exception's frame while the 413 is sent
        raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"decompressed body over {most} bytes: send smaller batches")
    return out


def decode_request(
    request_type: Any,
    body: bytes | bytearray,
    as_json: bool,
    limits: RequestLimits,
    reserve: Callable[[int], bool],
    release: Callable[[int], None],
) -> tuple[Any, int, Counts]:
    """The request's message, the queue space reserved for it and its counts: counted first (413 past a limit),
    then space reserved (:class:`QueueFull` when ``reserve`` says no), then decoded (400 when it does not)."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError

    kind = "OTLP/JSON" if as_json else "OTLP protobuf"
    try:
        if as_json:
            scan_json(body, limits)  # every value counted before json.loads builds one
            data = json.loads(body.decode("utf-8"))
            del body
            message = json_format.ParseDict(data, request_type(), ignore_unknown_fields=True)
            del data
            body = message.SerializeToString()  # counted like a protobuf body (a JSON body is at most 8 MiB)
        counts = scan_otlp(body, request_type.DESCRIPTOR, limits)
    except RequestTooBig as exc:
        raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(exc)) from None
    except (Malformed, DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError, TypeError, RecursionError) as exc:
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"body is not an {kind} {request_type.DESCRIPTOR.name}: {str(exc)[:200]}") from None
    size = counts.decoded_bytes(len(body))
    if not reserve(size):
        raise QueueFull
    try:
        return (message if as_json else request_type.FromString(body)), size, counts
    except DecodeError as exc:
        release(size)
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"body is not an {kind} {request_type.DESCRIPTOR.name}: {str(exc)[:200]}") from None
    except BaseException:
        release(size)
        raise
