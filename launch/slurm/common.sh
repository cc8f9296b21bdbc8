# shellcheck shell=bash
# Shared by train.sbatch, multinode.sbatch and sweep.sbatch (sourced, never run directly).
#
# Launch model: srun starts every rank directly (one Slurm task per GPU), no torchrun in between:
#  - Slurm owns every training process: it delivers signals to each rank, kills stragglers, accounts
#    them, and `srun` returns the highest rank exit code, so the trainer's "checkpointed, requeue me"
#    code (75) reaches this script unchanged. torchrun would turn it into its own failure code, does not
#    forward SIGUSR1, and gives workers only 30 s after SIGTERM before killing them mid-checkpoint.
#  - One code path for one node and for N nodes; rendezvous is the env:// store on the first node
#    (MASTER_ADDR/MASTER_PORT below), ranks come from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID
#    (hypersolid_scale/distributed/process_group.py reads them under srun).
#
# Preemption: the job asks for SIGUSR1 on the batch shell before its time limit (#SBATCH --signal=B:USR1@..).
# The trap below forwards it to srun, srun to every rank; the trainer finishes its step, writes a checkpoint
# and exits 75; this script then runs `scontrol requeue $SLURM_JOB_ID`. The requeued job (same job id, so the
# same run directory) resumes from the newest checkpoint and continues the same MLflow run (the checkpoint
# stores the run id). A SIGTERM (scancel, time limit, or Slurm preempting/requeueing the job itself) also makes
# the trainer checkpoint, but then Slurm decides what happens to the job and this script does not requeue it.
#
# Environment knobs (all optional):
#   HS_REPO           repository root (default: the directory sbatch was called from)
#   HS_PYTHON         Python interpreter (default: $HS_REPO/.venv/bin/python if present, else python3)
#   HS_RUN_DIR        run directory (default: runs/<job name>-<job id>; a run_dir=... argument wins)
#   HS_TRACKING_URI   MLflow tracking URI (default: MLFLOW_TRACKING_URI if set, else the trainer's default)
#   HS_MAX_REQUEUES   stop requeueing after this many restarts (default 50)
#   HS_SRUN_WAIT      seconds srun waits for the other ranks after the first one exits (default 600)
#   MASTER_ADDR, MASTER_PORT   rendezvous (default: first node, 20000 + job id % 20000)

hs_log() { echo "[hypersolid $(date +%FT%T)] $*"; }
hs_die() { echo "[hypersolid] error: $*" >&2; exit 2; }

# First value of `key=...` among the arguments, or empty.
hs_arg_value() {
    local key=$1 a v=""; shift
    for a in "$@"; do [[ $a == "$key="* ]] && v=${a#"$key="}; done
    printf '%s' "$v"
}

# Number from a Slurm GPU count such as "8", "a100:8" or "gpu:a100:4" (empty when none was requested).
hs_gpu_count() { local g=${1:-}; g=${g##*:}; [[ $g =~ ^[0-9]+$ ]] && printf '%s' "$g"; }

hs_setup() {
    [[ -n ${SLURM_JOB_ID:-} ]] || hs_die "not inside a Slurm job; submit with: sbatch $0 ..."
    cd "$HS_REPO" || hs_die "cannot cd to HS_REPO=$HS_REPO"
    [[ -f launch/train.py ]] || hs_die "launch/train.py not found in $PWD; submit from the repository root or export HS_REPO=/path/to/repo"
    if [[ -z ${HS_PYTHON:-} ]]; then
        if [[ -x .venv/bin/python ]]; then HS_PYTHON=$PWD/.venv/bin/python; else HS_PYTHON=python3; fi
    fi
    command -v "$HS_PYTHON" >/dev/null || hs_die "HS_PYTHON=$HS_PYTHON is not an executable; activate the environment or export HS_PYTHON"

    # One rank per GPU: a mismatch would leave GPUs idle or stack ranks on one GPU.
    local gpus tasks
    gpus=$(hs_gpu_count "${SLURM_GPUS_PER_NODE:-}")
    tasks=${SLURM_NTASKS_PER_NODE:-}
    if [[ -n $gpus && $gpus -gt 0 && -n $tasks && $tasks != "$gpus" ]]; then
        hs_die "--ntasks-per-node=$tasks but --gpus-per-node=$gpus; pass both with the same value, e.g. sbatch --gpus-per-node=$gpus --ntasks-per-node=$gpus ..."
    fi

    export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}
    export MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
    # Torch's intra-op threads per rank = the CPUs Slurm gave that rank (the data workers are processes).
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
    export PYTHONUNBUFFERED=1
}

# hs_args DEFAULT_RUN_DIR DEFAULT_RUN_NAME [user arguments...] -> array HS_ARGS, HS_RUN_DIR_USED.
# The user's arguments come first, unchanged (`--config FILE key=value ...`); defaults are appended only for
# keys the user did not set. The run dir must not change between a job and its requeued self: it defaults
# to one named after the job id, which requeueing keeps.
hs_args() {
    local default_dir=$1 default_name=$2; shift 2
    HS_ARGS=("$@")
    HS_RUN_DIR_USED=$(hs_arg_value run_dir "$@")
    if [[ -z $HS_RUN_DIR_USED ]]; then
        HS_RUN_DIR_USED=${HS_RUN_DIR:-$default_dir}
        HS_ARGS+=("run_dir=$HS_RUN_DIR_USED")
    fi
    [[ -n $(hs_arg_value tracking.run_name "$@") ]] || HS_ARGS+=("tracking.run_name=$default_name")
    local uri=${HS_TRACKING_URI:-${MLFLOW_TRACKING_URI:-}}
    [[ -z $uri || -n $(hs_arg_value tracking.tracking_uri "$@") ]] || HS_ARGS+=("tracking.tracking_uri=$uri")
}

# hs_train [trainer arguments...]: run every rank under srun, handle preemption, maybe requeue.
hs_train() {
    local rc last restarts=${SLURM_RESTART_COUNT:-0} state
    hs_log "job $SLURM_JOB_ID (restart $restarts) on ${SLURM_JOB_NODELIST}: ${SLURM_NTASKS:-1} ranks," \
           "rendezvous $MASTER_ADDR:$MASTER_PORT, run dir $HS_RUN_DIR_USED"
    hs_log "$HS_PYTHON launch/train.py $*"

    HS_SIGNALS="" HS_SRUN_PID=""
    trap 'hs_on_signal USR1' USR1
    trap 'hs_on_signal TERM' TERM
    state=$(mktemp -d "${TMPDIR:-/tmp}/hs-srun.XXXXXX") || hs_die "cannot make a temporary directory in ${TMPDIR:-/tmp}"
    # srun's exit status comes back through a file that a subshell writes once srun ends, not through this
    # shell's `wait`: bash loses the status of a child that ends while a trap runs (its `wait` then says -1), and
    # Slurm's SIGTERM reaches srun and this script at once (a requeue after a lost node, scancel). The subshell
    # starts srun first (srun keeps the default actions) and then ignores TERM and USR1, so it is neither killed
    # nor interrupted; this script passes SIGUSR1 on to srun itself.
    # --kill-on-bad-exit=0: after a preemption signal every rank exits 75 on its own; killing the others
    # as soon as the first one leaves could cut a checkpoint write short. --wait bounds a hung rank.
    (
        srun --kill-on-bad-exit=0 --wait="${HS_SRUN_WAIT:-600}" --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
            "$HS_PYTHON" launch/train.py "$@" &
        trap '' TERM USR1
        echo "$!" > "$state/pid"
        wait "$!"
        echo "$?" > "$state/rc"
    ) &
    local waiter=$!
    while [[ ! -s $state/pid ]] && kill -0 "$waiter" 2>/dev/null; do sleep 0.05; done
    HS_SRUN_PID=$(cat "$state/pid" 2>/dev/null)
    # A signal that came while srun was being started is passed on now.
    [[ $HS_SIGNALS != *USR1* || -z $HS_SRUN_PID ]] || kill -USR1 "$HS_SRUN_PID" 2>/dev/null
    # `wait` returns early (status > 128) whenever a trapped signal arrives: keep waiting until the subshell is gone.
    wait "$waiter"; last=$?
    while kill -0 "$waiter" 2>/dev/null; do wait "$waiter"; last=$?; done
    rc=$(cat "$state/rc" 2>/dev/null)
    [[ -n $rc ]] || rc=$last  # no status written: the subshell was killed (SIGKILL) before srun ended
    rm -rf "$state"
    trap - USR1
    hs_finish "$rc"
}

hs_on_signal() {
    HS_SIGNALS="$HS_SIGNALS $1"
    if [[ $1 == USR1 ]]; then
        hs_log "got SIGUSR1 (time limit or preemption ahead): asking every rank to checkpoint and exit"
        [[ -z $HS_SRUN_PID ]] || kill -USR1 "$HS_SRUN_PID" 2>/dev/null
    else
        # slurmd sends SIGTERM to the ranks itself; they checkpoint and exit 75.
        hs_log "got SIGTERM (cancelled, out of time, or requeued by Slurm): ranks checkpoint and stop"
    fi
}

hs_finish() {
    local rc=$1 restarts=${SLURM_RESTART_COUNT:-0}
    if [[ $rc == 0 ]]; then
        hs_log "training finished"
        exit 0
    fi
    if [[ $rc == 69 ]]; then  # EXIT_PEER_LOST (distributed/heartbeat.py): a node stopped answering
        hs_log "a node was lost (exit code 69, named above); not requeued from here: Slurm requeues the job itself" \
            "once it sets that node DOWN (--requeue), else resubmit with run_dir=$HS_RUN_DIR_USED to resume"
        exit "$rc"
    fi
    if [[ $rc != 75 ]]; then
        hs_log "trainer failed with exit code $rc; not requeueing (a failure would repeat). Output above."
        exit "$rc"
    fi
    if [[ $HS_SIGNALS == *TERM* ]]; then
        hs_log "checkpoint written; Slurm is ending this job, so it is not requeued from here"
        exit 75
    fi
    if (( restarts >= ${HS_MAX_REQUEUES:-50} )); then
        hs_log "checkpoint written, but the job was already restarted $restarts times (HS_MAX_REQUEUES); not requeueing"
        exit 75
    fi
    hs_log "checkpoint written; requeueing job $SLURM_JOB_ID (it resumes from the checkpoint in the same run dir)"
    trap '' TERM  # requeueing ends this very script with SIGTERM; let the log line above be the last word
    if ! scontrol requeue "$SLURM_JOB_ID"; then
        hs_log "scontrol requeue failed; resubmit the same command with run_dir=$HS_RUN_DIR_USED to resume"
        exit 75
    fi
    exit 0
}
