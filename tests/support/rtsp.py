"""A real RTSP server (GStreamer's gst-rtsp-server) that the tests start themselves, as a camera in the field.

Run as a script by Debian's own ``/usr/bin/python3`` (``python3-gi``, ``gir1.2-gst-rtsp-server-1.0``; the venv
has no GObject bindings), it serves a moving test pattern on a port it is given:

* ``/h264`` and ``/h265`` — the pattern encoded by ``x264enc`` / ``x265enc``, over TCP or UDP as the client asks;
* ``/stall`` — H.264 that stops after ``--stall-after`` seconds (4: FFmpeg probes ~2 s of it when it opens)
  while the RTSP session stays open (a ``valve`` starts dropping every buffer): the camera whose socket is up
  and whose frames are not.

Each client gets its own pipeline (media not shared), so a client that reconnects to ``/stall`` gets frames
again. :class:`RtspServer` starts the script on a free port, waits until it answers, and can SIGKILL it and
start it again on the same port.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

SYSTEM_PYTHON = "/usr/bin/python3"
SIZE = (320, 240)
FPS = 15

_ENCODERS = {
    "h264": "x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} ! rtph264pay name=pay0 pt=96",
    "h265": "x265enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} ! rtph265pay name=pay0 pt=96",
}


def _launch(codec: str, *, valve: bool = False) -> str:
    """The media pipeline of one mount (gst-launch syntax, in parentheses as RTSPMediaFactory wants)."""
    source = (f"videotestsrc is-live=true pattern=ball ! video/x-raw,width={SIZE[0]},height={SIZE[1]},"
              f"framerate={FPS}/1")
    gate = " ! valve name=gate drop=false" if valve else ""
    return f"( {source}{gate} ! {_ENCODERS[codec].format(fps=FPS)} )"


def serve(port: int, stall_after_s: float) -> None:  # pragma: no cover - runs under /usr/bin/python3
    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import GLib, Gst, GstRtspServer

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(port))
    mounts = server.get_mount_points()
    for codec in _ENCODERS:
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(_launch(codec))
        mounts.add_factory(f"/{codec}", factory)

    def close_valve(gate: Gst.Element) -> bool:
        gate.set_property("drop", True)  # every buffer dropped from now on; RTSP and RTP sockets stay open
        print("stalled", flush=True)
        return False

    def configured(_factory, media) -> None:
        gate = media.get_element().get_by_name("gate")
        GLib.timeout_add(int(stall_after_s * 1000), close_valve, gate)

    stall = GstRtspServer.RTSPMediaFactory()
    stall.set_launch(_launch("h264", valve=True))
    stall.connect("media-configure", configured)
    mounts.add_factory("/stall", stall)
    if server.attach(None) == 0:
        sys.exit(f"cannot listen on 127.0.0.1:{port}")
    print(f"serving on {port}", flush=True)
    GLib.MainLoop().run()


# ------------------------------------------------------------------------------- the test side


def _answers(port: int) -> bool:
    """The server speaks RTSP on ``port`` (an OPTIONS request gets an RTSP reply)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n\r\n")
            return sock.recv(64).startswith(b"RTSP/1.0")
    except OSError:
        return False


def _system_env() -> dict[str, str]:
    """This environment without the venv's Python settings (the script runs under Debian's Python)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


class RtspServer:
    """The script above in its own process on a fixed port; start, kill and start again."""

    def __init__(self, workdir: Path, *, port: int | None = None, stall_after_s: float = 4.0) -> None:
        from support.ports import free_port  # here: the script itself runs under Debian's Python, without tests/

        self.port = port or free_port()
        self.stall_after_s = stall_after_s
        self.log = workdir / "rtsp-server.log"
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None

    def url(self, mount: str) -> str:
        return f"rtsp://127.0.0.1:{self.port}/{mount}"

    def start(self, timeout: float = 15) -> RtspServer:
        """Start it and wait until it answers; RuntimeError saying why if it cannot (never a skip: `make
        system-deps` installs it)."""
        assert self.proc is None or self.proc.poll() is not None, "RTSP server already running"
        command = [SYSTEM_PYTHON, __file__, "--port", str(self.port), "--stall-after", str(self.stall_after_s)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=log, env=_system_env())
        deadline = time.monotonic() + timeout
        while not _answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"`{shlex.join(command)}` did not serve on {self.port} (apt-get install "
                                   "python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-ugly "
                                   f"gstreamer1.0-plugins-bad, or make system-deps):\n"
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL: every session dies with it, as when a camera loses power."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@contextlib.contextmanager
def running_rtsp_server(workdir: Path, **kwargs: float) -> Iterator[RtspServer]:
    """A fresh RTSP server on a free port, killed on exit (test modules wrap it in a fixture)."""
    server = RtspServer(workdir, **kwargs).start()
    try:
        yield server
    finally:
        server.kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stall-after", type=float, default=4.0, help="seconds /stall delivers before it stalls")
    args = parser.parse_args()
    serve(args.port, args.stall_after)
