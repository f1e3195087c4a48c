"""Answers from the reconciler thread to the event loop: one wake-up per burst of answers.

The reconciler answers a whole batch of submits at once. ``asyncio.wrap_future`` would cost one
``call_soon_threadsafe`` per answer: a write to the loop's self-pipe from the reconciler thread,
and a hand-off of the GIL to the loop that then has to be taken back, for every submit. A
``ReplyBox`` (one per event loop) collects the answers that arrive before the loop runs and
wakes it once for all of them.

The semantics of waiting are those of ``asyncio.wait_for(asyncio.wrap_future(fut), t)``: the
caller gets the future's result or exception; after ``timeout_s`` it gets ``TimeoutError`` and
the future is cancelled (the reconciler takes a cancelled future as "the caller gave up":
``inbox.reply``); if the waiting task is cancelled, so is the future.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from concurrent.futures import Future
from functools import partial
from typing import TypeVar

T = TypeVar("T")
Posted = tuple["asyncio.Future[object]", "Future[object]"]


class ReplyBox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._posted: list[Posted] = []
        self._woken = False  # a delivery is scheduled on the loop

    async def result(self, fut: Future[T], timeout_s: float, what: str) -> T:
        """``fut``'s result, awaited on the loop (``what``: the message of the timeout)."""
        waiter: asyncio.Future[T] = self.loop.create_future()
        fut.add_done_callback(partial(self._post, waiter))
        timer = self.loop.call_later(timeout_s, _expire, waiter, fut, what)
        try:
            return await waiter
        except asyncio.CancelledError:
            fut.cancel()
            raise
        finally:
            timer.cancel()

    def _post(self, waiter: asyncio.Future[T], fut: Future[T]) -> None:
        """``fut`` is done (called on the thread that finished it)."""
        with self._lock:
            self._posted.append((waiter, fut))  # type: ignore[arg-type]
            if self._woken:
                return
            self._woken = True
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, []
            self._woken = False
        for waiter, fut in posted:
            if waiter.done():  # timed out, or its task was cancelled
                continue
            if fut.cancelled():
                waiter.cancel()
                continue
            exc = fut.exception()
            if exc is None:
                waiter.set_result(fut.result())
            else:
                waiter.set_exception(exc)


def _expire(waiter: asyncio.Future[T], fut: Future[T], what: str) -> None:
    if not waiter.done():
        fut.cancel()
        waiter.set_exception(TimeoutError(what))


_BOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReplyBox] = weakref.WeakKeyDictionary()


def reply_box() -> ReplyBox:
    """The running loop's box."""
    loop = asyncio.get_running_loop()
    box = _BOXES.get(loop)
    if box is None:
        box = _BOXES[loop] = ReplyBox(loop)
    return box
