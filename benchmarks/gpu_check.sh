#!/usr/bin/env bash
# gpu_check.sh: every GPU measurement of issue 42 in ONE device call (at most 7.75 minutes), results under $OUT.
#
# ----------------------------------------------------------------------------------------------------------------
# The device call to make (the `run` tool; the machine is bare and offline, python3 there holds torch + GPyTorch
# but not Pyro/ArviZ, whose wheels travel in .device_wheels/, ignored through .git/info/exclude):
#
#   run(command="GPU_CHECK_BUDGET=450 bash benchmarks/gpu_check.sh",
#       carry=[".device_wheels"], timeout_s=500)
#
# (450 s of stages + about 15 s of packing; with a machine start of 1-2 minutes the call costs about 10 of the
# 15 device minutes, which leaves one fresh start (4 minutes at least) for a rerun of a failed stage with
# GPU_CHECK_STAGES, e.g. GPU_CHECK_STAGES="install lj_50k summarize" GPU_CHECK_BUDGET=150, timeout_s=200.)
#
# Before it, here: `ls .device_wheels` must show the 6 wheels and pytest_extra/ (else re-create them: see
# benchmarks/README.md, "GPU check"), and the rehearsal below must end with every stage ok. What comes back
# (7 files, all directly under $OUT): gpu_check.log (everything printed),
# gpu_check.md / gpu_check.json (stages, pytest table, targets, ML-II, errors), gpu_scaling.md / gpu_scaling.json
# (the format of benchmarks/gpu_scaling.py: commit as benchmarks/results/gpu_scaling.{md,json}),
# pytest_cuda.xml (JUnit), gpu_check_work.tar.gz (every stage's log and JSON lines).
# ----------------------------------------------------------------------------------------------------------------
#
# Stages, in order of value (each its own process under `timeout`; a stage that fails or times out is recorded,
# with its exit code and last lines, in stages.tsv, and the next stage runs; what a stage measured before it died
# is kept, since every item is appended to <stage>.jsonl as soon as it is measured):
#
#   stage         cap (s)  what
#   install          60    pip install --no-index --find-links .device_wheels pyro-ppl arviz (2 fallbacks)
#   env              40    nvidia-smi, versions (torch, torch.version.cuda, cuDNN, GPyTorch, ...), fp64 Cholesky rate
#   pytest          200    pytest -m cuda -v tests/test_cuda.py (every engine on CUDA vs CPU): 4 xdist workers,
#                          190 s a test (pytest-timeout), SIGINT at the stage's end so JUnit XML is still written
#   lj_small         60    log joint + grad vs floor vs GPyTorch: cuda at N = 1k, 2k, 5k, 10k, 20k; cpu at 1k, 2k, 5k
#   lj_40k           45    the same on cuda at N = 40,000
#   lj_50k           70    the same on cuda at N = 50,000
#   engines_cuda    120    CVI full step vs single-site step at N = 16,000 (3 full steps, 2,000 single-site
#                          steps); NUTS gradient evaluations per second (Boston); NUTS with 4-1,024 chains advancing
#                          together on Boston and 4-64 at N = 5,000 (issue 57, item 5: the batched call's time at
#                          1 to 1,024 thetas, then chain-gradients per second and the share of the wall in the log
#                          joint; each logged when measured, a run skipped when it would not end in time); last,
#                          DSVI default run on Boston (wall). GPU_CHECK_CUDA_WHAT picks the items
#   engines_cpu      70    the same on the CPU (16 cores): NUTS, DSVI capped at 1,000 steps, then CVI at N = 8,000
#                          (2 full, 300 single-site steps)
#   ml2_50k         110    ML-II at N = 50,000 from the optima on its first 5,000 then 20,000 rows; time,
#                          iterations, peak memory (max_memory_allocated); interrupted at the stage's budget (the best
#                          point is kept, its projected gradient measured); then 2 DSVI steps if time is left. Last
#                          but the summary, so that with a large cap (GPU_CHECK_CAPS) it takes what the others left
#   summarize        20    gpu_check.{md,json}, gpu_scaling.{md,json}
#
# The deadline: GPU_CHECK_BUDGET seconds (default 450) from the start. A stage runs under
# min(cap, time to the deadline - the minimum the later stages need); under its own minimum it is skipped
# (recorded as such). So the script ends by the deadline plus about 15 s of packing, inside timeout_s = 500.
#
# Cost model (how the sizes were chosen). Unit c(N) = N^3 flops at R = 40 TFLOP/s (an H100's float64 Cholesky,
# very roughly; env measures it at N = 8,192): c = 0.2 ms at 2k, 3 ms at 5k, 25 ms at 10k, 0.2 s at 20k,
# 1.6 s at 40k, 3.1 s at 50k. Per N the log-joint row costs the floor (Cholesky N^3/3 + cholesky_inverse
# 2N^3/3 = 1 c) twice (warm-up + 1 repeat from N = 20,000 on; 3 repeats below), gpvi's log joint + gradient
# (about 1.3 c) three times (warm-up, timing, peak memory), GPyTorch's exact MLL with Cholesky (about 2 c) twice:
# about 10 c = 31 s at 50k, 16 s at 40k, 2 s at 20k, plus about 8 s of imports and CUDA start per process.
# Memory at 50k: one N x N float64 copy is 20 GB (18.6 GiB); the floor holds K, L and K^-1 (60 GB), gpvi's
# two-buffer path 2 copies (40 GB), GPyTorch probably 4 or more: an out-of-memory error at 50k (or 40k) is
# expected on an 80 GB H100 and recorded as gpytorch_error in the row. CPU side (16 cores, R about 0.5 TFLOP/s):
# c(5k) = 0.25 s, row about 17 c = 4 s; 10k would cost 30 s, so the CPU rows stop at 5k. ML-II at 50k:
# about 1.2 evaluations per L-BFGS-B iteration at 1.3 c = 4 s each; from the 5k optimum (under 10 s to find)
# 5-15 iterations = 25-80 s; from the default start 30-80 iterations would not fit. (Measured on an H200: 6.3 s
# an evaluation, 1.35 evaluations an iteration; from the 20k optimum 17 iterations did not converge;
# run 7: 32 iterations, 61 evaluations, 383 s reached a stationary point.) So the fit
# runs until an alarm at the stage's budget interrupts it and ML2 returns its best point so far. CVI at 16k: full step about 1-2 c(16k) = 0.1-0.2 s;
# a single-site step is a rank-one update of an N x N factor, 2 GB read and written, about 1.5 ms at 3 TB/s plus
# launch latency; 2,000 steps = 3-10 s (the per-step time is what is reported, not a converged run). CPU CVI at
# 8k: full step about 1 c(8k) = 1 s, single-site step about 20 ms (0.5 GB at ~50 GB/s), 2,000 steps = 40 s:
# cut to 300. DSVI on Boston (N = 455), the default run: multi-start MAP, 500-900 steps of S = 4 draws (launch-
# bound on a GPU, 5-10 ms a step), the final bound: over 120 s on the loaded 2-core development machine even with
# 60 steps, so it goes last in its stage (CVI and NUTS are kept if it times out). pytest -m cuda: each test runs
# the engine on the CPU (1 thread) and on CUDA at N = 80-120 (10,000 for the large-N test); on CUDA these are
# launch-bound (about 0.1-1 ms an op). CPU-vs-CPU here (GPVI_TEST_DEVICE=cpu, 2 loaded cores): 713 s in all,
# test_nuts 471 s (2 x 4 chains x 600 iterations), the rest 0.3-70 s each; on the device's CPU + GPU test_nuts is
# the long pole (perhaps 150-300 s), so it runs on one xdist worker while the other tests share the rest (about
# 60-100 s of work over 3 workers); past 190 s it fails on pytest-timeout, past the stage's 200 s pytest is
# interrupted and the finished tests are still in the JUnit file.
# Expected on an H100: install 10 + env 15 + pytest 100-200 + lj 25 + 25 + 40 + ML-II 40-110 + engines 40-90 +
# 35-70 + summarize 5 = 335-590 s: the deadline cuts the tail (engines_cpu first, then engines_cuda's DSVI).
# Rehearsed here (GPU_CHECK_REHEARSE=1, 2 loaded cores): 139 s, every stage ok; with two stages forced to fail,
# one item forced to fail and one stage hanging: 225 s, each recorded, every other stage ok.
#
# Rehearsal on a CPU-only machine (tiny sizes, every stage runs, $OUT a temp folder when unset):
#   GPU_CHECK_REHEARSE=1 PYTHON=.venv/bin/python OMP_NUM_THREADS=1 nice -n 10 bash benchmarks/gpu_check.sh
#   GPU_CHECK_REHEARSE=1 GPU_CHECK_FAIL=lj_40k,ml2_50k,engines_cuda:cvi GPU_CHECK_HANG=engines_cpu ... \
#       bash benchmarks/gpu_check.sh
# (GPU_CHECK_FAIL: those stages raise at their start, stage:item one item inside a stage; GPU_CHECK_HANG: that
# stage sleeps until its timeout kills it.)
# Dry run of the device branch here (every command's arguments parse, pytest only collects, nothing is installed):
#   GPU_CHECK_DRY=1 PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh
# Other knobs: PYTHON (default python3), GPU_CHECK_BUDGET, GPU_CHECK_STAGES (a space-separated subset to run,
# e.g. "env install lj_50k summarize" for a rerun of one stage), GPU_CHECK_PYTEST_K (pytest -k expression),
# GPU_CHECK_CAPS (stage=seconds pairs replacing caps below, e.g. "ml2_50k=280": ML-II runs until its cap).
# GPU_CHECK_CUDA_WHAT (engines_cuda's items, default "cvi nuts nuts_chains dsvi").
# Both lists take spaces or commas; an unknown stage or a cap that is not a whole number stops the script at once.

set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
WHEELS="$ROOT/.device_wheels"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

# ------------------------------------------------------------------------ sub-commands (run under `timeout`)
if [ "${1:-}" = "__install" ]; then            # $2 = work folder
    want="pyro-ppl==1.9.2 arviz==0.23.4"
    if [ "${GPU_CHECK_DRY:-0}" = 1 ]; then
        ls "$WHEELS"/*.whl "$WHEELS"/pytest_extra/*.whl || exit 3
        echo "dry run: would install $want from $WHEELS"
        exit 0
    fi
    if [ "${GPU_CHECK_REHEARSE:-0}" = 1 ]; then   # never touch the local venv: install into a throw-away target
        $PY -m pip install -q --no-index --no-deps --no-compile --target "$2/site" "$WHEELS"/*.whl \
            "$WHEELS"/pytest_extra/*.whl || exit 3
        echo "$2/site" >"$2/pythonpath"
        echo "rehearsal: wheels installed into $2/site"
        exit 0
    fi
    if $PY -c "import pyro, arviz" 2>/dev/null; then
        echo "pyro and arviz already importable"
    elif $PY -m pip install -q --no-index --find-links "$WHEELS" $want; then
        echo "installed with dependency resolution: $want"
    elif $PY -m pip install -q --no-index --no-deps --no-compile "$WHEELS"/*.whl; then
        echo "installed without dependency resolution (the first try failed)"
    else
        $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpvi_site "$WHEELS"/*.whl || exit 3
        echo /tmp/gpvi_site >"$2/pythonpath"
        echo "installed into /tmp/gpvi_site (PYTHONPATH)"
    fi
    if ! $PY -c "import xdist, pytest_timeout" 2>/dev/null; then    # in the image's list; carried in case
        $PY -m pip install -q --no-index --no-deps --no-compile "$WHEELS"/pytest_extra/*.whl \
            || echo "pytest-xdist / pytest-timeout not installed: pytest runs serially without test_nuts"
    fi
    exit 0
fi
if [ "${1:-}" = "__env" ]; then
    nvidia-smi || echo "nvidia-smi: not available"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
    uname -a; nproc; free -g 2>/dev/null | head -2
    $PY -c "import sys, torch; print(sys.executable, sys.version.split()[0], 'torch', torch.__version__,
                                      'cuda', torch.version.cuda)"
    pkgs='torch|gpytorch|linear.operator|numpy|scipy|pandas|xarray|h5py|matplotlib|scikit-learn|pyro-ppl|arviz'
    $PY -m pip list 2>/dev/null | grep -iE "^($pkgs|pytest|pytest-timeout|pytest-xdist) " || true
    exit 0
fi

# ------------------------------------------------------------------------ set-up
REHEARSE=${GPU_CHECK_REHEARSE:-0}
if [ -z "${OUT:-}" ]; then
    OUT=$(mktemp -d /tmp/gpu_check_out.XXXXXX)
    echo "OUT was unset: writing to $OUT"
fi
mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu_check_work.XXXXXX)
export GPVI_BENCH_OUT="$W/results"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
T0=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-450}
DEADLINE=$((T0 + BUDGET))
GC=(-m benchmarks.gpu_check)

if [ "$REHEARSE" = 1 ]; then            # CPU, N in the hundreds: every stage runs, in a few minutes
    DEV=cpu
    export GPVI_TEST_DEVICE=cpu
    PYTEST_K=${GPU_CHECK_PYTEST_K-"test_ml2 or test_cvi_full or test_large_n or test_gp_classifier"}
    LJ_SMALL=(--sizes 200 400 --cpu-sizes 200); LJ_40K=(--sizes 600); LJ_50K=(--sizes 800)
    ML2=(--n 800 --warm-n 200,400)
    ENG_DEV=(--what ${GPU_CHECK_CUDA_WHAT:-cvi nuts nuts_chains dsvi} --cvi-n 300 --cvi-full-steps 2
             --cvi-single-steps 50 --nuts-warmup 10 --nuts-draws 10 --chains 4 8 --chains-big-n 120 --chains-big 4
             --chains-warmup 5 --chains-big-warmup 3 --chains-big-reserve 5 --dsvi-num-steps 60 --boston-rows 80)
    ENG_CPU=(--cvi-n 200 --cvi-full-steps 2 --cvi-single-steps 50 --nuts-warmup 10 --nuts-draws 10
             --dsvi-num-steps 60 --boston-rows 80)
    PYTEST_TIMEOUT=100 PYTEST_WORKERS=2
else
    DEV=cuda
    PYTEST_K=${GPU_CHECK_PYTEST_K-}
    LJ_SMALL=(--sizes 1000 2000 5000 10000 20000 --cpu-sizes 1000 2000 5000)
    LJ_40K=(--sizes 40000); LJ_50K=(--sizes 50000)
    ML2=(--n 50000 --warm-n 5000,20000)
    # many chains advancing together (issue 57, item 5) before DSVI, which may run into the stage's cap
    ENG_DEV=(--what ${GPU_CHECK_CUDA_WHAT:-cvi nuts nuts_chains dsvi} --cvi-n 16000 --cvi-full-steps 3
             --cvi-single-steps 2000 --nuts-warmup 50 --nuts-draws 50 --chains 4 64 256 1024 --chains-big-n 5000
             --chains-big 4 16 64 --chains-warmup 10 --chains-big-warmup 5 --chains-big-reserve 30)
    # the host CPU's NUTS rate first, then DSVI for 1,000 steps (a rate per step); its CVI rates are run 1's
    ENG_CPU=(--what nuts dsvi cvi --dsvi-num-steps 1000 --cvi-n 8000 --cvi-full-steps 2 --cvi-single-steps 300
             --nuts-warmup 50 --nuts-draws 50)
    PYTEST_TIMEOUT=190 PYTEST_WORKERS=4
fi

#           name          cap  min
PLAN=(      install       60   10
            env           40   10
            pytest       200   30
            lj_small      60   15
            lj_40k        45   20
            lj_50k        70   30
            engines_cuda 120   20
            engines_cpu   70   15
            ml2_50k      110   40
            summarize     20   10 )
# Check the knobs before anything runs: a typo must not cost device time (commas are taken as spaces).
CAPS=${GPU_CHECK_CAPS:-}; CAPS=${CAPS//,/ }
STAGES=${GPU_CHECK_STAGES:-}; STAGES=${STAGES//,/ }
NAMES=" "; for ((i = 0; i < ${#PLAN[@]}; i += 3)); do NAMES+="${PLAN[i]} "; done
for i in $STAGES; do
    [[ "$NAMES" == *" $i "* ]] || { echo "GPU_CHECK_STAGES: unknown stage '$i' (stages:$NAMES)"; exit 2; }
done
for i in $CAPS; do
    if [[ "$i" != *=* ]] || [[ "$NAMES" != *" ${i%%=*} "* ]] || ! [[ "${i#*=}" =~ ^[0-9]+$ ]]; then
        echo "GPU_CHECK_CAPS: '$i' is not stage=seconds with a known stage (stages:$NAMES)"; exit 2
    fi
done
ONLY=" $STAGES "
: >"$W/stages.tsv"
echo "gpu_check: rehearse=$REHEARSE device=$DEV budget=${BUDGET}s work=$W out=$OUT start=$(date -u +%FT%TZ)"

reserve_after() {   # the minimum seconds the stages after $1 need
    local i r=0 seen=0
    for ((i = 0; i < ${#PLAN[@]}; i += 3)); do
        if [ $seen = 1 ] && { [ "$ONLY" = "  " ] || [[ "$ONLY" == *" ${PLAN[i]} "* ]]; }; then
            r=$((r + PLAN[i + 2]))
        fi
        [ "${PLAN[i]}" = "$1" ] && seen=1
    done
    echo $r
}

stage() {           # stage NAME COMMAND...: run under timeout, record status, rc, seconds, last lines
    local name=$1 cap min i t rc t0 t1 secs status tail
    shift
    for ((i = 0; i < ${#PLAN[@]}; i += 3)); do
        [ "${PLAN[i]}" = "$name" ] && cap=${PLAN[i + 1]} && min=${PLAN[i + 2]}
    done
    for i in $CAPS; do                                     # e.g. GPU_CHECK_CAPS="ml2_50k=280 pytest=120"
        [ "${i%%=*}" = "$name" ] && cap=${i#*=}
    done
    if [ "$ONLY" != "  " ] && [[ "$ONLY" != *" $name "* ]]; then return 0; fi
    t=$((DEADLINE - $(date +%s) - $(reserve_after "$name")))
    [ "$name" = summarize ] && t=$cap                      # always summarise
    [ $t -gt $cap ] && t=$cap
    if [ $t -lt $min ]; then
        echo "=== $name: SKIPPED (only ${t}s left for it, needs $min)"
        printf '%s\tskipped\t-\t0\t%s\tonly %ss left before the deadline\n' "$name" "$t" "$t" >>"$W/stages.tsv"
        return 0
    fi
    echo "=== $name: start $(date -u +%T), timeout ${t}s, $(( $(date +%s) - T0 ))s since start"
    STAGE_T=$t
    STAGE_END=$(($(date +%s) + t))
    export GPU_CHECK_STAGE_END=$STAGE_END                  # a stage may pace itself (engines: nuts_chains)
    t0=$(date +%s%N)
    "$@" 2>&1 | tee "$W/$name.log"
    rc=${PIPESTATUS[0]}
    t1=$(date +%s%N)
    secs=$(printf '%d.%d' $(((t1 - t0) / 1000000000)) $((((t1 - t0) / 100000000) % 10)))
    case $rc in 0) status=ok ;; 124|137) status=timeout ;; *) status=failed ;; esac
    tail=$(tail -n 15 "$W/$name.log" 2>/dev/null | tr '\t\r' '  ' | cut -c1-300 | awk '{printf "%s \\n ", $0}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$secs" "$t" "$tail" >>"$W/stages.tsv"
    echo "=== $name: $status (rc $rc) after ${secs}s"
}

to() {              # run under what is left of the current stage's timeout
    local r=$((STAGE_END - $(date +%s)))
    [ $r -lt 1 ] && r=1
    timeout -k 10 $r "$@"
}

# ------------------------------------------------------------------------ stages
run_env() { to bash "$ROOT/benchmarks/gpu_check.sh" __env && to "$PY" "${GC[@]}" env --work "$W"; }
run_install() {
    to bash "$ROOT/benchmarks/gpu_check.sh" __install "$W" || return $?
    local pp=""
    [ -f "$W/pythonpath" ] && pp="$(cat "$W/pythonpath"):"
    PYTHONPATH="$pp$PYTHONPATH" to "$PY" -c "import pyro, arviz, gpvi
print('pyro', pyro.__version__, pyro.__file__); print('arviz', arviz.__version__); print('gpvi', gpvi.__file__)"
}
run_pytest() {      # xdist workers when there (test_nuts then runs beside the others), else serial without it
    local extra=() k=$PYTEST_K r
    "$PY" -c "import pytest_timeout" 2>/dev/null && extra+=(--timeout "$PYTEST_TIMEOUT")
    if "$PY" -c "import xdist" 2>/dev/null; then
        extra+=(-n "$PYTEST_WORKERS")
    else
        k="${k:+($k) and }not test_nuts"
        echo "no pytest-xdist: test_nuts deselected (about 2 x 4 chains x 600 iterations, too long serially)"
    fi
    [ -n "$k" ] && extra+=(-k "$k")
    [ "${GPU_CHECK_DRY:-0}" = 1 ] && extra+=(--collect-only)
    r=$((STAGE_END - $(date +%s)))
    timeout -s INT -k 20 $r "$PY" -m pytest -m cuda -v tests/test_cuda.py -o addopts="" -p no:cacheprovider -rA \
        --durations=0 --junitxml="$W/pytest_cuda.xml" "${extra[@]}"
}
run_py() { to "$PY" "${GC[@]}" "$@" --work "$W"; }

stage install run_install
[ -f "$W/pythonpath" ] && export PYTHONPATH="$(cat "$W/pythonpath"):$PYTHONPATH"
stage env run_env
stage pytest run_pytest
stage lj_small run_py logjoint --tag lj_small --device $DEV "${LJ_SMALL[@]}" --repeats 3
stage lj_40k run_py logjoint --tag lj_40k --device $DEV "${LJ_40K[@]}" --repeats 1
stage lj_50k run_py logjoint --tag lj_50k --device $DEV "${LJ_50K[@]}" --repeats 1
stage engines_cuda run_py engines --tag engines_cuda --device $DEV "${ENG_DEV[@]}"
stage engines_cpu run_py engines --tag engines_cpu --device cpu "${ENG_CPU[@]}"
ml2_stage() { run_py ml2 --tag ml2_50k --device $DEV "${ML2[@]}" --budget $((STAGE_T - 12)) --dsvi-steps 2; }
stage ml2_50k ml2_stage                 # last but the summary: with a large cap it takes what the others left
stage summarize run_py summarize --device $DEV

# ------------------------------------------------------------------------ results back: at most 8 files
for f in gpu_check.md gpu_check.json pytest_cuda.xml results/gpu_scaling.md results/gpu_scaling.json; do
    [ -f "$W/$f" ] && cp "$W/$f" "$OUT/" || echo "not produced: $f"
done
tar -C "$W" --exclude=site -czf "$OUT/gpu_check_work.tar.gz" . 2>/dev/null || echo "tar failed"
echo "=== stages (name, status, rc, seconds, timeout):"
cut -f1-5 "$W/stages.tsv"
echo "=== total $(( $(date +%s) - T0 ))s; files in $OUT:"
ls -la "$OUT"
[ "${GPU_CHECK_KEEP:-0}" = 1 ] && echo "work folder kept: $W" || rm -rf "$W"     # all of it is in the tarball
sleep 1                                          # let tee write the last lines of gpu_check.log
