#!/usr/bin/env bash
# The replication study's cpu group (plan.py --group cpu lists its runs in the order they run) in the background,
# resumable: run it again after a stop or a reboot and it skips the finished runs and resumes the interrupted
# one from its checkpoint.
#     bash benchmarks/replication/cpu.sh [benchmarks.replication.run arguments, e.g. --parallel 2]
# Log: runs/replication_scratch/cpu.log (the folder: $HS_REPLICATION_SCRATCH if set; it holds the checkpoints, so
# keep it on a disk that a reboot does not clear); results: benchmarks/results/replication/cpu/.
set -u
cd "$(dirname "$0")/../.." || exit 1
SCRATCH=${HS_REPLICATION_SCRATCH:-$PWD/runs/replication_scratch}
PY=${PYTHON:-python3}
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
mkdir -p "$SCRATCH"
PIDFILE="$SCRATCH/cpu.pid"
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "already running (pid $(cat "$PIDFILE")); watch it with: tail -f $SCRATCH/cpu.log"
  exit 0
fi
# One process at a time by default: the machine's 2 cores are shared, and one training already uses both.
# On a machine shared with other work: HS_NICE=1 runs it under nice -n 19 with one thread per process, in a
# session of its own whose autogroup is niced too: with autogroup scheduling (Linux's default for desktops and
# many servers, /proc/sys/kernel/sched_autogroup_enabled) the CPU is shared between sessions first, so a niced
# process in its own session would still take half of the machine from a test suite started in another one.
NICE=()
if [ -n "${HS_NICE:-}" ]; then
  NICE=(setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null; exec nice -n 19 "$@"' study)
  export OMP_NUM_THREADS=1
fi
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" nohup "${NICE[@]}" "$PY" -m benchmarks.replication.run --group cpu \
  --device cpu --parallel 1 --scratch "$SCRATCH" --out benchmarks/results/replication "$@" >> "$SCRATCH/cpu.log" 2>&1 &
echo $! > "$PIDFILE"
echo "cpu group started (pid $!); what is left: python -m benchmarks.replication.plan --group cpu, and the"
echo "report's 'planned, done and left' table; about 2-5 min training per epoch + 1-2.5 min per evaluation"
echo "watch:  tail -f $SCRATCH/cpu.log      (one line per finished run)"
echo "stop:   kill $! (the running training checkpoints; run this script again to resume)"
