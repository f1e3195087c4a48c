"""The frames between a pty job's terminal host and the server's relay (``base/ptyframes``)."""

from __future__ import annotations

import pytest

from gpufence.control.base.ptyframes import (
    DATA,
    EXIT,
    MAX_PAYLOAD,
    RESIZE,
    FrameError,
    FrameReader,
    frame,
    parse_resize,
    resize_frame,
)


def test_frames_split_anywhere_come_out_whole_and_in_order() -> None:
    stream = frame(DATA, b"hello") + resize_frame(40, 120) + frame(DATA, b"") + frame(EXIT, b"3")
    for cut in range(len(stream) + 1):
        reader = FrameReader()
        got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert got == [(DATA, b"hello"), (RESIZE, b"\x00\x28\x00\x78"), (DATA, b""), (EXIT, b"3")]


def test_a_resize_is_clamped_to_what_a_terminal_takes() -> None:
    ((kind, payload),) = FrameReader().feed(resize_frame(0, 70000))
    assert kind == RESIZE and parse_resize(payload) == (1, 0xFFFF)
    with pytest.raises(FrameError, match="4 bytes"):
        parse_resize(b"\x00\x01")


@pytest.mark.parametrize(
    "bad",
    [b"q\x00\x00\x00\x00", DATA + (MAX_PAYLOAD + 1).to_bytes(4, "big")],
    ids=["unknown kind", "too long"],
)
def test_a_bad_frame_is_an_error_not_a_buffer_without_bound(bad: bytes) -> None:
    with pytest.raises(FrameError):
        FrameReader().feed(bad)
