"""Launch a real `tritonserver` process (the CPU binary of the nvidia-pytriton wheel).

The wheel's binary needs three things set up (see ENVIRONMENT.md): the python backend
stub copied next to libtriton_python.so (done by scripts/fetch-tritonserver), this
interpreter's libpython first on LD_LIBRARY_PATH, and this interpreter's bin/ first on
PATH so that model.py imports come from the same environment.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from devstack.failures import ChildFailed, ExitedChild, log_size

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_HOME = REPO_ROOT / ".cache" / "tritonserver" / "pytriton" / "tritonserver"
SHM_DIR = Path("/dev/shm")
PYTHON_SHM_PREFIX = "triton_python_backend_shm_region_"  # the python backend's default region prefix
LOOPBACK = "127.0.0.1"  # where devstack's servers listen: nothing outside this machine reaches them


def free_port() -> int:
    """Return a TCP port on the loopback address that is free right now."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def find_tritonserver_home() -> Path:
    """Locate the unpacked wheel's `pytriton/tritonserver` directory, fetching it if needed."""
    home = Path(os.environ.get("TRITONSERVER_HOME_DIR", DEFAULT_HOME))
    if (home / "bin" / "tritonserver").exists():
        return home
    out = subprocess.run(
        [str(REPO_ROOT / "scripts" / "fetch-tritonserver")],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    return Path(out.stdout.strip().splitlines()[-1])


def installed_backends(home: Path) -> list[str]:
    """The backends of the tritonserver in `home` (its backends/ folder: the CPU wheel has only `python`)."""
    return sorted(path.name for path in (home / "backends").iterdir() if path.is_dir())


def unique_shm_prefix() -> str:
    """A python-backend region prefix of its own (`<default prefix>devstack_<hex>_`), for one server."""
    return f"{PYTHON_SHM_PREFIX}devstack_{secrets.token_hex(6)}_"


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes of process group `pgid`, from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError, IndexError):
            continue  # the process went away meanwhile
        if state != "Z" and int(group) == pgid:
            members.append(int(stat.parent.name))
    return members


def kill_group(pgid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL what is left of process group `pgid` and wait until none of it runs."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.05)


STUB_PYTHON_ENV = "TRITON_STUB_PYTHON"


def _libdir(python: Path) -> str:
    if python == Path(sys.executable):
        return sysconfig.get_config_var("LIBDIR") or ""
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR') or '')"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def server_environment(home: Path, stub_python: Path | None = None) -> dict[str, str]:
    """Environment in which the wheel's tritonserver and python stub find the right libraries.

    The python-backend stub imports model.py's packages from the environment of the `python3`
    first on PATH: `stub_python` (default $TRITON_STUB_PYTHON, else this interpreter). A separate
    one keeps the stub's numpy 1 apart from an interpreter that needs numpy 2.
    """
    env = dict(os.environ)
    python = Path(stub_python or env.get(STUB_PYTHON_ENV) or sys.executable)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (_libdir(python), env.get("LD_LIBRARY_PATH", "")) if p
    )
    env["PATH"] = os.pathsep.join((str(python.parent), env.get("PATH", "")))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the python models' imports write nothing into the model repository
    return env


@dataclass
class TritonServer:
    """A tritonserver child process serving `repository`; use as a context manager.

    It listens on `host` only (loopback by default: nothing outside this machine reaches it); ports default to
    free ones. `model_control` is "explicit" (load `load_models`, by default
    every model: `*`; then load and unload over the repository API), as compose runs it, or "none".
    `stub_python`: see `server_environment`.
    `shm_prefix` names the python backend's /dev/shm regions; `stop` unlinks them.
    """

    repository: Path
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    host: str = LOOPBACK
    model_control: str = "explicit"
    load_models: tuple[str, ...] = ("*",)
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 120.0
    stub_python: Path | None = None
    shm_prefix: str = field(default_factory=unique_shm_prefix)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _cleaned_up: bool = field(default=False, init=False, repr=False)  # of this `process`
    log_start: int = field(default=0, init=False)  # where this run starts in `log_path`

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.http_address}"

    @property
    def http_address(self) -> str:
        """host:port of the HTTP endpoint, as GATEWAY_TRITON_HTTP_URL takes it."""
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self, home: Path) -> list[str]:
        cmd = [
            str(home / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={home / 'backends'}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--exit-on-error=true",
            "--strict-readiness=true",
            f"--model-control-mode={self.model_control}",
            "--log-verbose=0",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        if self.model_control == "explicit":
            cmd += [f"--load-model={m}" for m in self.load_models]
        return cmd + list(self.extra_args)

    def start(self) -> Self:
        """Start the process and wait until /v2/health/ready answers 200."""
        home = find_tritonserver_home()
        self.log_start = log_size(self.log_path)
        with open(self.log_path or os.devnull, "ab") as log:
            self.process = subprocess.Popen(
                self.command(home),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_environment(home, self.stub_python),
                start_new_session=True,  # its own process group: tritonserver and its python stubs
            )
        self._cleaned_up = False
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and (code := self.process.poll()) is not None:
                self.stop()  # the stubs it leaves, and its regions
                exited = ExitedChild("tritonserver", code, self.log_path, self.log_start)
                raise ChildFailed(f"tritonserver {exited.how} while loading {self.repository}; log: {self.log_path}",
                                  self.log_path, self.log_start)
            if self.is_ready():
                return
            time.sleep(0.05)
        self.stop()
        raise ChildFailed(f"tritonserver not ready after {self.startup_timeout_s:g} s; log: {self.log_path}",
                          self.log_path, self.log_start)

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL with `kill=True`) and wait for it.

        Then kill what is left of its process group (python stubs) and unlink its /dev/shm
        regions, which a SIGKILLed server leaves behind. Also cleans up after a server that died.
        """
        if self.process is None or self._cleaned_up:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_group(self.process.pid)
                self.process.wait(timeout=10)
        kill_group(self.process.pid)
        self.remove_shm()
        self._cleaned_up = True  # once: the group's id may be reused from here on

    def shm_files(self) -> list[Path]:
        """This server's python-backend regions in /dev/shm."""
        return sorted(SHM_DIR.glob(f"{self.shm_prefix}*"))

    def remove_shm(self) -> None:
        """Unlink this server's python-backend regions (call only when it is gone)."""
        for path in self.shm_files():
            path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
