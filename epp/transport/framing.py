"""gRPC message framing: the 5-byte prefix, reassembly, statuses.

A message on the wire is a prefix (1 byte compressed flag, 4 bytes
big-endian length) and the message. `MessageReader` reassembles one call's
messages from DATA frames in linear time: it appends to one buffer, parses
at an offset, copies out only a finished message, and drops what it has
read once that is at least half the buffer. A message whose prefix declares
more than the limit, or a compressed one, is refused at its prefix, before
any of it is buffered.
"""

from __future__ import annotations

from enum import IntEnum
from urllib.parse import quote

PREFIX_BYTES = 5


class Status(IntEnum):
    """gRPC status codes (the ones this server and its handlers use)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


class FramingError(Exception):
    """A message the reader refuses; the call ends with `status`."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def prefix(length: int) -> bytes:
    """The prefix of an uncompressed message of `length` bytes."""
    return b"\x00" + length.to_bytes(4, "big")


def trailers(status: Status, message: str) -> list[tuple[bytes, bytes]]:
    """The trailers that end a call (`grpc-message` percent-encoded)."""
    fields = [(b"grpc-status", b"%d" % status)]
    if message:
        fields.append((b"grpc-message", quote(message, safe=" ").encode()))
    return fields


class MessageReader:
    """One call's inbound messages, reassembled from its DATA frames."""

    __slots__ = ("_buffer", "_offset", "held", "max_message_bytes")

    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes
        self._buffer = bytearray()
        self._offset = 0
        self.held = 0
        """Bytes held of a message not yet complete."""

    def clear(self) -> int:
        """Drop the partial message; the bytes dropped."""
        dropped = self.held
        self._buffer = bytearray()
        self._offset = self.held = 0
        return dropped

    def feed(self, data: bytes) -> list[bytes]:
        """The messages `data` completes, in order; raises FramingError at
        the first prefix that is refused (earlier messages are lost with it)."""
        if not self.held:
            messages, used = self._parse(data, 0)
            if used < len(data):
                self._buffer += memoryview(data)[used:]
                self.held = len(data) - used
            return messages
        buffer = self._buffer
        buffer += data
        with memoryview(buffer) as view:
            messages, self._offset = self._parse(view, self._offset)
        self.held = len(buffer) - self._offset
        if not self.held:
            buffer.clear()
            self._offset = 0
        elif self._offset >= len(buffer) // 2:
            del buffer[: self._offset]
            self._offset = 0
        return messages

    def _parse(self, data: bytes | memoryview, offset: int) -> tuple[list[bytes], int]:
        """Whole messages from `offset` on (copies), and where the rest starts."""
        messages = []
        size = len(data)
        while size - offset >= PREFIX_BYTES:
            if data[offset]:
                raise FramingError(Status.UNIMPLEMENTED, "compressed messages are not supported")
            length = int.from_bytes(data[offset + 1 : offset + PREFIX_BYTES], "big")
            if length > self.max_message_bytes:
                raise FramingError(
                    Status.RESOURCE_EXHAUSTED,
                    f"message of {length} bytes over the limit of {self.max_message_bytes}",
                )
            end = offset + PREFIX_BYTES + length
            if size < end:
                break
            messages.append(bytes(data[offset + PREFIX_BYTES : end]))
            offset = end
        return messages, offset
