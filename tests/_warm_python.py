"""``python launch/train.py ...`` (or ``python -c CODE ...``) without paying for the imports every time.

Importing the package (torch, torchvision, lightly, the config stack) takes 5-15 s of CPU on a busy 2-core
machine, and most tests of the launchers' one-line errors end well before their first training step. A
server process imports the package once; each run is a fork of it that sets ``sys.argv``, the environment,
the working directory and the standard streams, then runs the script as ``__main__`` and leaves like a fresh
interpreter would: an uncaught exception's traceback is printed, ``sys.exit``'s code is the exit status, the
non-daemon threads are waited for, the atexit handlers run and the standard streams are flushed (only the
teardown of the modules, seconds with torch loaded, is skipped). What the test sees is a
``subprocess.CompletedProcess`` with the exit code, stdout and stderr of that process.
``run_python_together`` forks several runs at once, to start them concurrently (e.g. on one new MLflow store).
``run_processes`` runs a script on N processes: torchrun's own agent (``--standalone`` rendezvous, the workers'
environment, its failure report and exit code 1) in a fork, its workers forked from it in turn (torchrun's
``--start-method fork`` with the script as a function): a 3-step 2-process training takes ~2 s instead of ~12.

What a fork cannot show is the import phase of a fresh interpreter, nor torchrun's own process tree (signals,
a killed agent): the tests that start the launchers as real subprocesses (tests/test_train.py,
test_run_lock.py, test_lifeline.py, test_torchrun_restart.py, test_errors_train.py, the demo, Slurm and
comparison tests) keep covering them.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from hypersolid_scale.safety.process_exit import exit_steps, leave_now  # stdlib only

REPO = Path(__file__).resolve().parents[1]

# What launch/train.py, eval.py and compare.py import at their start, and what a training imports on its way
# (data formats, MLflow and its SQL store, the plots, the evaluation's scikit-learn): imported once here. A
# name missing here (moved, renamed) costs time only: the run imports what it needs.
_PRELOAD = ("hypersolid_scale.training.trainer", "hypersolid_scale.safety.errors", "hypersolid_scale.safety.lifeline",
            "hypersolid_scale.eval.app", "hypersolid_scale.compare.app", "hypersolid_scale.data.loading.random_access",
            "hypersolid_scale.data.formats.builtin", "hypersolid_scale.data.formats.imagefolder",
            "hypersolid_scale.data.formats.webdataset", "hypersolid_scale.data.augment.tensor_aug",
            "hypersolid_scale.data.augment.transforms", "hypersolid_scale.distributed.engines.ddp", "hypersolid_scale.tracking",
            "mlflow", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store", "alembic", "sqlalchemy",
            "matplotlib.pyplot", "sklearn.neighbors", "sklearn.cluster", "sklearn.linear_model", "kornia")


def _serve() -> None:
    """The server's loop: one JSON request per line on stdin, one JSON answer per line on stdout."""
    import importlib

    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # moved or renamed: the runs import what they need themselves
            pass
    requests, answers = sys.stdin, sys.stdout
    answers.write("ready\n")
    answers.flush()
    for line in requests:
        batch = json.loads(line)  # the runs to start together
        pids = []
        for req in batch:
            pid = os.fork()
            if pid == 0:
                _child(req)  # never returns: it ends with os._exit
            pids.append(pid)
        answers.write(json.dumps({"pids": pids}) + "\n")
        answers.flush()
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        answers.write(json.dumps({"returncodes": codes}) + "\n")
        answers.flush()


def _child(req: dict) -> None:
    os.setpgid(0, 0)  # its own group: a timed-out run is killed with whatever it started
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    sys.stdin = open(0, closefd=False)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    argv = req["argv"]
    try:
        if req.get("nproc"):
            _torchrun(req["nproc"], argv)
        elif argv[0] == "-c":  # python -c CODE ARGS: sys.argv is ["-c", ARGS...], sys.path starts with ""
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            _run_main(argv)
        code = 0
    except SystemExit as stop:  # what the interpreter does with it
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    leave_now(code)  # a fresh interpreter's exit, less the teardown of its modules (seconds with torch loaded)


def _run_main(argv: Sequence[str]) -> None:
    """``python SCRIPT ARGS``: the script as ``__main__``, sys.path starting with the script's folder."""
    import runpy

    sys.argv = list(argv)
    sys.path.insert(0, str(Path(argv[0]).resolve().parent))
    runpy.run_path(argv[0], run_name="__main__")


def _run_script(argv: list[str]) -> None:
    """One worker of :func:`_torchrun`: the script as ``__main__``; a nonzero exit is the worker's exit code."""
    try:
        _run_main(argv)
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
    finally:  # multiprocessing's children leave with os._exit: what the interpreter would do on its way out
        exit_steps()


def _torchrun(nproc: int, argv: list[str]) -> None:
    """``torchrun --standalone --nproc_per_node=N SCRIPT ARGS`` with its workers forked from this process
    (``--start-method fork`` and the script as a function entrypoint): torchrun's own agent, rendezvous and
    worker environment, without N + 1 interpreters importing torch and the package. Exits like torchrun:
    1 (with the failure report on stderr) when a worker failed."""
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser

    args = get_args_parser().parse_args([f"--nproc_per_node={nproc}", "--start-method", "fork", *argv])
    args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())  # --standalone
    config, _, _ = config_from_args(args)
    try:
        elastic_launch(config, _run_script)(list(argv))
    except ChildFailedError as err:  # torchrun prints it and exits 1
        print(err, file=sys.stderr)
        raise SystemExit(1) from None


class _Server:
    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        env.pop("HS_DEBUG", None)
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True, cwd=REPO)
        assert self.proc.stdout.readline().strip() == "ready", "the warm Python server did not start"
        self.lock = threading.Lock()

    def run(self, argvs: Sequence[Sequence[str]], env: Mapping[str, str], cwd: str | os.PathLike | None,
            timeout: float, nproc: int | None = None) -> list[subprocess.CompletedProcess]:
        with self.lock, tempfile.TemporaryDirectory() as tmp:
            streams = [(Path(tmp) / f"stdout{i}", Path(tmp) / f"stderr{i}") for i in range(len(argvs))]
            batch = [{"argv": [str(a) for a in argv], "env": dict(env), "cwd": str(cwd or os.getcwd()), "nproc": nproc,
                      "stdout": str(out), "stderr": str(err)} for argv, (out, err) in zip(argvs, streams)]
            self.proc.stdin.write(json.dumps(batch) + "\n")
            self.proc.stdin.flush()
            pids = json.loads(self.proc.stdout.readline())["pids"]
            timed_out = threading.Event()

            def kill() -> None:
                timed_out.set()
                for pid in pids:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:  # it ended just now
                        pass

            timer = threading.Timer(timeout, kill)
            timer.start()
            try:
                answer = self.proc.stdout.readline()
            finally:
                timer.cancel()
            if not answer:
                raise RuntimeError("the warm Python server died")
            texts = [(out.read_text(errors="replace"), err.read_text(errors="replace")) for out, err in streams]
        cmds = [[sys.executable, *argv] for argv in argvs]
        if timed_out.is_set():
            raise subprocess.TimeoutExpired(cmds[0], timeout, *texts[0])
        codes = json.loads(answer)["returncodes"]
        return [subprocess.CompletedProcess(cmd, code, *text) for cmd, code, text in zip(cmds, codes, texts)]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_server: _Server | None = None


def run_python(argv: Sequence[str | os.PathLike], *, env: Mapping[str, str], cwd: str | os.PathLike | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Like ``subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True)``:
    ``argv`` is ``[SCRIPT, ARGS...]`` or ``["-c", CODE, ARGS...]``. ``env`` must hold ``OMP_NUM_THREADS=1``
    (the server's torch was imported with it)."""
    return run_python_together([argv], env=env, cwd=cwd, timeout=timeout)[0]


def run_python_together(argvs: Sequence[Sequence[str | os.PathLike]], *, env: Mapping[str, str],
                        cwd: str | os.PathLike | None = None,
                        timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """``run_python`` of each ``argv`` at once: the processes are forked one after the other in a few
    milliseconds and run concurrently; returns when all have ended (``timeout`` kills them all)."""
    return _warm_server(env).run([[str(a) for a in argv] for argv in argvs], env, cwd, timeout)


def run_processes(argv: Sequence[str | os.PathLike], *, nproc: int, env: Mapping[str, str],
                  cwd: str | os.PathLike | None = None, timeout: float = 300,
                  torchrun: bool = False) -> subprocess.CompletedProcess:
    """``argv`` (``[SCRIPT, ARGS...]``, e.g. launch/train.py) on ``nproc`` processes, each a fork of the warm
    server: ``run_python`` for one (unless ``torchrun``); for more, torchrun's agent with ``--standalone``
    rendezvous and forked workers (``_torchrun``), like ``python -m torch.distributed.run --standalone
    --nproc_per_node=N``."""
    argv = [str(a) for a in argv]
    if nproc == 1 and not torchrun:
        return run_python(argv, env=env, cwd=cwd, timeout=timeout)
    done = _warm_server(env).run([argv], env, cwd, timeout, nproc=nproc)[0]
    done.args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *argv]
    return done


def _warm_server(env: Mapping[str, str]) -> _Server:
    global _server
    assert env.get("OMP_NUM_THREADS") == "1", "runs share the server's torch, imported with OMP_NUM_THREADS=1"
    if _server is None or _server.proc.poll() is not None:
        _server = _Server()
        atexit.register(_server.close)
    return _server


if __name__ == "__main__":
    del sys.path[0]  # this folder: the runs get the script's own (PYTHONPATH holds the repository)
    _serve()
