"""A throw-away Slurm cluster (munged + slurmctld + slurmd) for the launch-script tests: :class:`LocalSlurm`, one
node (this host, on 127.0.0.1); tests/slurm_namespaced.py builds one of several nodes on it.

Everything lives in one temporary directory: its own munge key and socket, its own slurm.conf
with free TCP ports, state and spool directories and logs, so it never touches a system-wide
Slurm or munge that may already run on the machine. Daemons run in the foreground as children of
this process and are stopped by pid.

Usable on its own for poking at the scripts by hand:

    python tests/slurm_cluster.py          # starts a cluster, prints `export SLURM_CONF=...`, waits for Ctrl-C
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _net import free_port

REQUIRED_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "sacct")
# The Debian packages that provide the binaries above (`apt-get install -y ...`).
DEBIAN_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")


class SlurmUnavailable(RuntimeError):
    """Raised when this machine cannot run a local Slurm (not root, packages missing, daemon fails)."""


def unavailable_reason() -> str | None:
    """Why a local cluster cannot be started here, or None when it can be tried."""
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (munged runs as the munge user, slurmd as root)"
    missing = [b for b in REQUIRED_BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return (f"Slurm/munge binaries missing: {', '.join(missing)}; install them with "
                f"`apt-get install -y {' '.join(DEBIAN_PACKAGES)}`")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no `munge` user (the Debian munge package creates it)"
    return None



def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class LocalSlurm:
    """One node (this host, all its CPUs), one partition `debug`, no accounting, no cgroups."""

    def __init__(self, root: Path | None = None, partition: str = "debug") -> None:
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="hs-slurm-"))
        self.partition = partition
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_dir = self.root / "munge"
        self.munge_socket = self.munge_dir / "munge.socket"
        self._procs: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------ environment for clients
    @property
    def env(self) -> dict[str, str]:
        """Environment for sbatch/squeue/...: points the client commands at this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        for key in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_ARRAY_JOB_ID"):
            env.pop(key, None)  # the tests may themselves run inside a Slurm job
        return env

    def client(self, *args: str) -> list[str]:
        """The command line that runs a Slurm client command (sbatch, squeue, ...) against this cluster."""
        return list(args)

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.client(*args), env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout)

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60) -> LocalSlurm:
        reason = unavailable_reason()
        if reason:
            raise SlurmUnavailable(reason)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # munged (user munge) must traverse it
        try:
            self._start_munge()
            self._start_slurm()
            self._wait_node_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Cancel this cluster's jobs, then stop the daemons this object started (by pid), last started first
        (slurmd, slurmctld, munged)."""
        self._cancel_jobs()
        for name in reversed(list(self._procs)):
            proc = self._procs.pop(name)
            if proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def _cancel_jobs(self, timeout: float = 60) -> None:
        # slurmstepd outlives slurmd: a job still running when the daemons stop would be orphaned.
        ctld = self._procs.get("slurmctld")
        if ctld is None or ctld.poll() is not None:
            return
        try:
            jobs = self.run("squeue", "-h", "-o", "%A", check=False, timeout=20).stdout.split()
            if not jobs:
                return
            self.run("scancel", *jobs, check=False, timeout=20)
            deadline = time.monotonic() + timeout  # SIGTERM, then SIGKILL after KillWait
            while time.monotonic() < deadline and self.run("squeue", "-h", check=False, timeout=20).stdout.strip():
                time.sleep(0.5)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ daemons
    def _spawn(self, name: str, cmd: list[str], user: str | None = None) -> None:
        log = open(self.root / f"{name}.stdout", "ab")
        self._procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             user=user, env=self.env, start_new_session=True)
        log.close()
        time.sleep(0.3)
        if self._procs[name].poll() is not None:
            raise SlurmUnavailable(f"{name} exited at start with code {self._procs[name].returncode}:\n"
                                   + self.logs(name))

    def _start_slurm(self) -> None:
        self._write_conf()
        self._spawn("slurmctld", [_binary("slurmctld"), "-D", "-c", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", [_binary("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])

    @property
    def node_names(self) -> list[str]:
        """The compute nodes' Slurm names."""
        return [self.node]

    def _start_munge(self) -> None:
        # A private key and socket: the cluster never depends on (or disturbs) a system munged.
        munge = pwd.getpwnam("munge")
        self.munge_dir.mkdir(mode=0o700, exist_ok=True)
        key = self.munge_dir / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for path in (self.munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        # Debian's default socket directory, for anyone who points clients at the standard path.
        run_munge = Path("/run/munge")
        if not run_munge.exists():
            run_munge.mkdir(mode=0o755, parents=True)
            os.chown(run_munge, munge.pw_uid, munge.pw_gid)
        d = self.munge_dir
        self._spawn("munged", [_binary("munged"), "-F", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                               f"--seed-file={d / 'munged.seed'}"], user="munge")
        deadline = time.monotonic() + 20
        while not self.munge_socket.exists():
            if time.monotonic() > deadline or self._procs["munged"].poll() is not None:
                raise SlurmUnavailable("munged did not create its socket:\n" + self.logs("munged"))
            time.sleep(0.1)

    def _node_lines(self) -> str:
        """slurm.conf's NodeName and PartitionName lines."""
        cpus = os.cpu_count() or 1
        mem_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.9)
        return (f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN\n"
                f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n")

    def _write_conf(self, controller: str = "", slurmd_files: str = "slurmd", extra: str = "") -> None:
        """slurm.conf; ``controller`` is SlurmctldHost's value (default: this host on 127.0.0.1), ``slurmd_files`` the
        stem of slurmd's spool directory, pid and log file (``slurmd-%n`` gives each node its own)."""
        r = self.root
        for sub in ("state", "spool"):
            (r / sub).mkdir(exist_ok=True)
        spool = "spool" if slurmd_files == "slurmd" else f"spool-{slurmd_files}"
        self.conf.write_text(f"""\
# Generated for a throw-away test cluster: no accounting, no cgroups.
ClusterName=hstest
SlurmctldHost={controller or f"{self.node}(127.0.0.1)"}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also delays a requeued job's restart (default 120 s); short here so the tests need not wait.
AuthInfo=socket={self.munge_socket},cred_expire=5
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / spool}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / f'{slurmd_files}.pid'}
SlurmctldLogFile={r / 'slurmctld.log'}
SlurmdLogFile={r / f'{slurmd_files}.log'}
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: they are not available in every container; process tracking by process tree.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Start pending (requeued) jobs within a second or two instead of at the default 30-60 s scheduling passes.
SchedulerParameters=bf_interval=1,sched_interval=2
ReturnToService=2
JobRequeue=1
# Keep finished jobs visible to scontrol for the tests' checks.
MinJobAge=600
KillWait=30
InactiveLimit=0
SlurmdTimeout=300
{extra}{self._node_lines()}""")

    def _wait_node_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"{name} died during start-up:\n" + self.logs(name))
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=20)
            states = dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)
            state = out.stdout.strip() or out.stderr.strip()
            if out.returncode == 0 and sorted(states) == sorted(self.node_names) \
                    and all(s.startswith("idle") for s in states.values()):
                return
            time.sleep(0.5)
        raise SlurmUnavailable(f"nodes not idle after {timeout:.0f}s (state {state!r}):\n" + self.logs("slurmctld")
                               + "".join(self.logs(n) for n in self._procs if n.startswith("slurmd")))

    # ------------------------------------------------------------------ helpers for tests
    def logs(self, name: str, tail: int = 40) -> str:
        parts = []
        for path in (self.root / f"{name}.log", self.root / f"{name}.stdout", self.munge_dir / f"{name}.log"):
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                parts.append(f"--- {path}\n" + "\n".join(lines))
        return "\n".join(parts) + "\n"

    def sbatch(self, *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None) -> str:
        """Submit; returns the job id (`--parsable`)."""
        out = subprocess.run(self.client("sbatch", "--parsable", *args), env={**self.env, **(env or {})}, cwd=cwd,
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed ({out.returncode}): {out.stderr}")
        return out.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, RestartCnt, ExitCode, ...); {} once forgotten."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        fields: dict[str, str] = {}
        for token in out.stdout.split():
            if "=" in token:
                k, v = token.split("=", 1)
                fields.setdefault(k, v)
        return fields

    def wait(self, job_id: str, timeout: float, states: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED",
                                                                          "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
             ) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} not in {states} after {timeout:.0f}s: {info}")


def main() -> None:
    cluster = LocalSlurm().start()
    print(f"export SLURM_CONF={cluster.conf}\n# cluster up in {cluster.root}; Ctrl-C stops it", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
