"""A turn's share of a connection's input: `FrameCounter` walks the HTTP/2
frame headers (9 bytes each) across reads, without parsing frames, and says
where the frames one turn of the event loop hands h2 end (the connection's
`max_frames_per_turn`, `max_new_streams_per_turn`, `max_bytes_per_turn`)."""

from __future__ import annotations

FRAME_HEADER_BYTES = 9
HEADERS_FRAME = 0x1
PREFACE_BYTES = 24


class FrameCounter:
    """Where a turn's share of a connection's bytes ends: walks the HTTP/2
    frame headers (9 bytes each) across reads, without parsing frames."""

    __slots__ = ("_header", "_skip")

    def __init__(self) -> None:
        self._skip = PREFACE_BYTES
        """Bytes of the current frame's payload (or the preface) still to come."""
        self._header = b""
        """The start of a frame header cut by the end of a read."""

    def cut(self, data: bytes, frames: int, streams: int, size: int) -> int:
        """The length of `data`'s prefix that starts at most `frames` frames,
        `streams` HEADERS frames and, once past `size` bytes, no new frame;
        walks that prefix."""
        position, end = 0, len(data)
        while position < end:
            if self._skip:
                step = min(self._skip, end - position)
                position += step
                self._skip -= step
                continue
            if self._header:
                header = self._header + data[position : position + 9 - len(self._header)]
            else:
                header = data[position : position + FRAME_HEADER_BYTES]
            if len(header) < FRAME_HEADER_BYTES:
                self._header = header
                return end
            if frames <= 0 or position >= size or (header[3] == HEADERS_FRAME and streams <= 0):
                return position
            position += FRAME_HEADER_BYTES - len(self._header)
            self._header = b""
            frames -= 1
            streams -= header[3] == HEADERS_FRAME
            self._skip = int.from_bytes(header[:3], "big")
        return end
