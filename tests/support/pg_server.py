#!/usr/bin/env python3
"""A throwaway PostgreSQL server for tests.

Owns: one temporary cluster (initdb) in a fresh temp dir, listening on a free
TCP port of 127.0.0.1 with its Unix socket inside the temp dir, trust
authentication, no fsync; stopped and deleted afterwards. Must not touch any
other PostgreSQL cluster or system service. When run as root the server runs
as the `postgres` user (PostgreSQL refuses root) through `runuser`.

As a module:
    from pg_server import postgres_server
    with postgres_server() as url:       # postgresql://postgres@127.0.0.1:PORT/flyt_test
        ...
As a CLI wrapper:
    pg_server.py -- CMD ARGS...          # runs CMD with FLYT_TEST_POSTGRES_URL set
Binaries come from FLYT_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin.
"""

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SUPERUSER = "postgres"
DATABASE = "flyt_test"


class PostgresError(RuntimeError):
    pass


def find_bindir():
    env = os.environ.get("FLYT_PG_BINDIR")
    if env:
        candidates = [env]
    else:

        def version(path):
            try:
                return float(path.split("/")[-2])
            except ValueError:
                return 0.0

        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
        on_path = shutil.which("pg_ctl")
        if on_path:
            candidates.append(os.path.dirname(on_path))
    for d in candidates:
        if os.path.exists(os.path.join(d, "initdb")) and os.path.exists(os.path.join(d, "pg_ctl")):
            return d
    raise PostgresError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found under /usr/lib/postgresql/*/bin; "
        "install them (apt-get install postgresql) or set FLYT_PG_BINDIR")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """Start with start(), stop with stop(); `url` is set while running."""

    def __init__(self, bindir=None, database=DATABASE):
        self.bindir = bindir or find_bindir()
        self.database = database
        self.tmpdir = None
        self.port = None
        self.url = None
        self._as_postgres = os.geteuid() == 0

    # --- helpers
    def _cmd(self, args):
        if self._as_postgres:
            return ["runuser", "-u", SUPERUSER, "--"] + args
        return args

    def _run(self, args, what):
        proc = subprocess.run(self._cmd(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=self.tmpdir)
        if proc.returncode != 0:
            raise PostgresError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout}")
        return proc.stdout

    def _log_tail(self):
        try:
            with open(os.path.join(self.tmpdir, "server.log")) as f:
                return f.read()[-4000:]
        except OSError:
            return "(no server log)"

    def url_for(self, database):
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    # --- lifecycle
    def start(self):
        self.tmpdir = tempfile.mkdtemp(prefix="flyt-pg-")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _start(self):
        if self._as_postgres:
            import pwd
            try:
                pw = pwd.getpwnam(SUPERUSER)
            except KeyError:
                raise PostgresError("running as root needs a 'postgres' user to run the server")
            os.chown(self.tmpdir, pw.pw_uid, pw.pw_gid)
            # The temp dir's parents must be searchable by postgres.
            parent = os.path.dirname(self.tmpdir)
            if not os.access(parent, os.X_OK) or (os.stat(parent).st_mode & 0o001) == 0:
                raise PostgresError(f"{parent} is not searchable by the postgres user; "
                                    "set TMPDIR to a world-searchable folder such as /tmp")
        data = os.path.join(self.tmpdir, "data")
        self._run([os.path.join(self.bindir, "initdb"), "-D", data, "-U", SUPERUSER,
                   "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"], "initdb")
        last_error = None
        for _ in range(3):  # a port picked free may be taken before the server binds it
            self.port = free_port()
            options = (f"-p {self.port} -c listen_addresses=127.0.0.1 "
                       f"-c unix_socket_directories='{self.tmpdir}' -c fsync=off "
                       "-c synchronous_commit=off -c full_page_writes=off "
                       "-c max_connections=50")
            proc = subprocess.run(
                self._cmd([os.path.join(self.bindir, "pg_ctl"), "-D", data, "-l",
                           os.path.join(self.tmpdir, "server.log"), "-o", options, "-w", "-t",
                           "60", "start"]),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=self.tmpdir)
            if proc.returncode == 0:
                break
            last_error = f"pg_ctl start failed:\n{proc.stdout}\n{self._log_tail()}"
        else:
            raise PostgresError(last_error)
        self.url = self.url_for("postgres")
        createdb = os.path.join(self.bindir, "createdb")
        if not os.path.exists(createdb):
            createdb = shutil.which("createdb") or "createdb"
        self._run([createdb, "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER,
                   self.database], "createdb")
        self.url = self.url_for(self.database)

    def stop(self):
        if self.tmpdir is None:
            return
        data = os.path.join(self.tmpdir, "data")
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            subprocess.run(self._cmd([os.path.join(self.bindir, "pg_ctl"), "-D", data, "-m",
                                      "immediate", "-w", "stop"]),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        self.tmpdir = None
        self.url = None


@contextlib.contextmanager
def postgres_server(bindir=None, database=DATABASE):
    """Yields the URL of a fresh server; stops and deletes it on exit."""
    server = PostgresServer(bindir=bindir, database=database)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def main(argv):
    if "--" not in argv:
        print("usage: pg_server.py -- CMD ARGS...\n"
              "Runs CMD with FLYT_TEST_POSTGRES_URL pointing at a throwaway PostgreSQL.",
              file=sys.stderr)
        return 2
    cmd = argv[argv.index("--") + 1:]
    if not cmd:
        print("pg_server.py: no command after --", file=sys.stderr)
        return 2

    # Turn SIGTERM/SIGHUP (e.g. a ctest timeout) into a clean stop.
    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    server = PostgresServer()
    try:
        started = time.monotonic()
        try:
            url = server.start()
        except PostgresError as e:
            print(f"pg_server.py: {e}", file=sys.stderr)
            return 1
        print(f"pg_server.py: PostgreSQL at {url} (started in "
              f"{time.monotonic() - started:.1f} s)", file=sys.stderr)
        env = dict(os.environ, FLYT_TEST_POSTGRES_URL=url)
        child = subprocess.Popen(cmd, env=env)
        try:
            return child.wait()
        except KeyboardInterrupt:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
            return 130
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
