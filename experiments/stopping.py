"""How a launcher stops on request: SIGTERM (preemption) and SIGINT (Ctrl-C) handled alike.

The first signal asks the loop to stop (`StopSignals.should_stop`): it saves where it is (a
checkpoint at the current step, or the finished chunks of an evaluation), raises `loop.Interrupted`,
and the launcher exits with `exit_code()`: 0 after SIGTERM, so a scheduler reruns the command, 130
(128 + SIGINT) after Ctrl-C, as shells expect. No KeyboardInterrupt traceback.

A stop that arrives inside one long call (compiling, one big jitted evaluation, a method's own host
loop) cannot reach the loop until the call returns, so the signal also starts a backstop: after
`grace_s` seconds the process logs what was saved last (`loop.LAST_SAVED`) and ends with the same
exit code through `os._exit`, without waiting for the call. A second signal ends it at once. The
backstop runs on its own thread, woken through `signal.set_wakeup_fd` by the interpreter's C-level
handler, so it fires even while the main thread is blocked in XLA.

Before a launcher has built its `StopSignals` (while it imports, parses flags and loads the config),
`exit_at_once_until_started` ends it at once on either signal, with the same exit code: nothing has
been written yet.

What was finished is on disk either way (checkpoints and chunk files are written atomically), so
running the same command again resumes.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

from absl import logging

DEFAULT_GRACE_S = 20.0  # seconds from the signal to the backstop's exit: inside 30 s with margin
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code_for(signum: int) -> int:
  """0 for SIGTERM (preemption: the job is resumable), 128 + signum otherwise (130 for SIGINT)."""
  return 0 if signum == signal.SIGTERM else 128 + signum


def exit_at_once_until_started() -> None:
  """Until `StopSignals` takes over, SIGTERM/SIGINT end the launcher at once with `exit_code_for`:
  while it imports, parses flags and loads the config nothing has been written, so nothing is lost
  (and no KeyboardInterrupt traceback). Call first thing in a launcher's module."""
  for signum in SIGNALS:
    signal.signal(signum, _exit_before_start)


def _exit_before_start(signum, frame) -> None:
  del frame
  print(
    f"{signal.Signals(signum).name} before the run started: nothing to save; exiting",
    file=sys.stderr,
    flush=True,
  )
  os._exit(exit_code_for(signum))


class StopSignals:
  """Installs the SIGTERM/SIGINT handlers and the backstop; call from the main thread."""

  def __init__(self, grace_s: float = DEFAULT_GRACE_S, last_saved=lambda: "nothing yet"):
    self.grace_s, self.last_saved = grace_s, last_saved
    self.requested = threading.Event()
    self.signum: int | None = None
    self._reader, writer = socket.socketpair()
    writer.setblocking(False)
    self._writer = writer  # kept open: the interpreter writes each signal's number to it
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    for signum in SIGNALS:
      signal.signal(signum, self._on_signal_in_main_thread)
    threading.Thread(target=self._backstop, name="stop-backstop", daemon=True).start()

  def should_stop(self, phase: str, step: int) -> bool:
    del phase, step
    return self.requested.is_set()

  def exit_code(self) -> int:
    return exit_code_for(self.signum if self.signum is not None else signal.SIGTERM)

  def _on_signal_in_main_thread(self, signum, frame) -> None:
    del frame  # the backstop thread has already seen it; nothing to raise here
    self._request(signum)

  def _request(self, signum: int) -> bool:
    """Records the first signal; True if this one is the first."""
    first = not self.requested.is_set()
    if first:
      self.signum = signum
      self.requested.set()
    return first

  def _backstop(self) -> None:
    signum = self._reader.recv(1)[0]
    if self._request(signum):
      logging.warning(
        "%s: saving and stopping; exiting within %.0f s (a second signal exits at once)",
        signal.Signals(signum).name,
        self.grace_s,
      )
    deadline = time.monotonic() + self.grace_s
    self._reader.settimeout(self.grace_s)
    try:
      while time.monotonic() < deadline:
        self._reader.settimeout(max(deadline - time.monotonic(), 1e-3))
        if self._reader.recv(1):
          logging.warning("second signal: exiting now")
          break
    except TimeoutError:
      pass
    self._exit_now()

  def _exit_now(self) -> None:
    message = (
      f"stop requested {self.grace_s:.0f} s ago and the current call has not returned; exiting "
      f"without waiting for it. Last saved: {self.last_saved()}. Run the same command again to "
      "resume."
    )
    logging.warning("%s", message)
    print(message, file=sys.stderr, flush=True)
    logging.flush()
    os._exit(self.exit_code())
