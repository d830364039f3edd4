"""A real PostgreSQL that the tests start themselves: ``initdb`` + ``pg_ctl`` in a temporary folder, on a
free port, from the Debian package (``apt-get install postgresql``; ``make system-deps`` does it).

PostgreSQL refuses to run as root: run as root (CI, this machine), the server runs as the
``postgres`` system user the Debian package creates, in a folder handed to that user.

A server that cannot start is an error (RuntimeError) that names the command, its exit status and the tail
of its output and of the server's log — never a skip: ``make test`` installs PostgreSQL, so a test that needs
it and cannot have it has failed.
"""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from support.ports import free_port


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    return Path(found[-1]).parent if found else None


BIN = _bin_dir()
MISSING = None if BIN else "PostgreSQL is not installed (apt-get install postgresql, or make system-deps)"



def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class PostgresServer:
    """One PostgreSQL cluster in ``workdir``; ``create_database()`` gives each test its own database."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        if BIN is None:
            raise RuntimeError(MISSING)
        self.workdir = Path(workdir)
        self.data = self.workdir / "data"
        self.port = port or free_port()
        self.user = "postgres" if os.geteuid() == 0 else None
        self.log = self.workdir / "postgres.log"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a PostgreSQL program as the server's user; with ``check``, a non-zero exit is a RuntimeError that
        says why (a program that cannot run at all always is)."""
        command = shlex.join(args)
        try:
            done = subprocess.run(list(args), capture_output=True, text=True, user=self.user, cwd=self.workdir,
                                  timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:  # missing, not executable, timed out
            raise RuntimeError(f"PostgreSQL: `{command}` could not run: {exc}{self._log_tail()}") from exc
        if check and done.returncode != 0:
            output = _tail(done.stdout + done.stderr)
            said = f":\n{output}" if output else " (no output)"
            raise RuntimeError(f"PostgreSQL: `{command}` exited with status {done.returncode}{said}{self._log_tail()}")
        return done

    def _log_tail(self) -> str:
        """The end of the server's log, if it wrote one, as a paragraph of an error message."""
        try:
            text = _tail(self.log.read_text(errors="replace"))
        except OSError:
            return ""
        return f"\n--- the end of {self.log}:\n{text}" if text else ""

    def start(self) -> PostgresServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.user:
            account = pwd.getpwnam(self.user)
            for folder in (self.workdir, *self.workdir.parents):  # the postgres user must reach its folder
                if folder in (Path("/"), Path("/tmp")):
                    break
                folder.chmod(folder.stat().st_mode | 0o011)
            shutil.chown(self.workdir, account.pw_uid, account.pw_gid)
        if not (self.data / "PG_VERSION").exists():
            self._run(str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                      "--no-sync")
        options = f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=off " \
                  "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60",
                  "start")
        return self

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "test") -> str:
        """A fresh, empty database; its SQLAlchemy URL."""
        import sqlalchemy as sa

        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        engine = sa.create_engine(self.url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        return self.url_for(name)

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def running(self) -> bool:
        return self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "status", check=False).returncode == 0

    def wait_ready(self, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._run(str(BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), check=False).returncode == 0:
                return True
            time.sleep(0.1)
        return False
