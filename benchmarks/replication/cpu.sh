#!/usr/bin/env bash
# The replication study's cpu group (16 one-epoch runs, and one evaluated every 100 steps) in the background,
# resumable: run it again after a stop or a reboot and it skips the finished runs and resumes the interrupted
# one from its checkpoint.
#     bash benchmarks/replication/cpu.sh [run.py arguments, e.g. --parallel 2]
# Log: /tmp/hs_replication/cpu.log; results: benchmarks/results/replication/cpu/.
set -u
cd "$(dirname "$0")/../.." || exit 1
SCRATCH=/tmp/hs_replication
PY=${PYTHON:-python3}
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
mkdir -p "$SCRATCH"
PIDFILE="$SCRATCH/cpu.pid"
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "already running (pid $(cat "$PIDFILE")); watch it with: tail -f $SCRATCH/cpu.log"
  exit 0
fi
# One process at a time by default: the machine's 2 cores are shared, and one training already uses both.
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" nohup "$PY" benchmarks/replication/run.py --group cpu --device cpu \
  --parallel 1 --scratch "$SCRATCH" "$@" >> "$SCRATCH/cpu.log" 2>&1 &
echo $! > "$PIDFILE"
echo "cpu group started (pid $!), about 16 x (2-5 min training + 1-2.5 min evaluation) + 15 min on 2 cores"
echo "watch:  tail -f $SCRATCH/cpu.log      (one line per finished run)"
echo "stop:   kill $! (the running training checkpoints; run this script again to resume)"
