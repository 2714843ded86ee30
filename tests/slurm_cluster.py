"""A real one-node Slurm on this machine, for the tests: munged, slurmctld and slurmd started
from the distribution's binaries with a minimal configuration under a temporary folder.

Nothing is installed here (`.ci/run` installs slurmctld, slurmd and munge); `start()` raises
`SlurmUnavailable` with the reason when the binaries are missing or the daemons do not come up.
Clients (sinfo, sbatch, submitit) find the cluster through the SLURM_CONF variable.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "squeue", "scancel", "scontrol")


class SlurmUnavailable(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1024


class LocalSlurm:
    def __init__(self, root: Path, cpus: int = 2) -> None:
        self.root = root
        self.cpus = cpus
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.pids: dict[str, int] = {}

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        for d in ("munge", "state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        r = self.root
        memory = max(256, _memory_mb() // 2)
        self.conf.write_text(f"""\
ClusterName=mambatune
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
SchedulerType=sched/backfill
MpiDefault=none
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - lives as long as the daemon
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.pids[name] = proc.pid

    def _log_tail(self, name: str) -> str:
        for path in (self.root / "log" / f"{name}.log", self.root / "log" / f"{name}.out"):
            if path.exists() and path.read_text(errors="replace").strip():
                return " | ".join(path.read_text(errors="replace").strip().splitlines()[-3:])
        return "(no log)"

    def start(self, timeout_s: float = 60.0) -> None:
        missing = [b for b in BINARIES if shutil.which(b) is None]
        if missing:
            raise SlurmUnavailable(f"Slurm/munge binaries missing: {', '.join(missing)} "
                                   "(apt-get install slurmctld slurmd munge; .ci/run does)")
        if os.geteuid() != 0:
            raise SlurmUnavailable("starting slurmd needs root")
        self._write_config()
        self._spawn("munged", ["munged", "-F", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={self.root / 'munge' / 'munge.key'}",
                               f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}",
                               f"--seed-file={self.root / 'munge' / 'munged.seed'}"])
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"munged did not start: {self._log_tail('munged')}")
            time.sleep(0.2)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        time.sleep(1.0)
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
            state = (r.stdout or r.stderr).strip()
            if r.returncode == 0 and state == "idle":
                return
            time.sleep(0.5)
        raise SlurmUnavailable(f"the node did not become idle in {timeout_s:.0f} s (sinfo: {state!r}); "
                               f"slurmctld: {self._log_tail('slurmctld')}; slurmd: {self._log_tail('slurmd')}")

    def stop(self) -> None:
        if self.pids.get("slurmctld") is not None:  # also where Slurm is not installed: nothing to cancel
            subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True)
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.pop(name, None)
            if pid is None:
                continue
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(50):
                try:
                    if os.waitpid(pid, os.WNOHANG) != (0, 0):
                        break
                except ChildProcessError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.killpg(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
