#!/usr/bin/env bash
# A GPU check on a lent GPU machine (torch 2.11 + CUDA, no fbgemm-gpu, no network), in three calls.
#
# The repository (about 5.5 MB tracked) plus one half of ../shared/tools/stage-fbgemm-gpu.sh's archive
# (about 59 MiB) no longer fit one call's 64 MiB, so the archive travels in three parts, one per call,
# gathered in /tmp there; the first call also starts the batch-65536 dataset in the background.
#
#   here, once (about 3 minutes):
#     echo /.gpu/ >> .git/info/exclude
#     ../shared/tools/stage-fbgemm-gpu.sh .gpu && bash tools/gpu_check_remote.sh split .gpu
#     cp my_plans.jsonl .gpu/p3/            # eval.py --out files whose plans the GPU should measure (tracked
#                                           # ones travel with the tree: results/honest_margins/*/emu_dlrm*.jsonl.gz)
#   there, three calls made one after another (the machine goes back 30 s after a call):
#     call 1, carry .gpu/p1:  bash tools/gpu_check_remote.sh part 1
#     call 2, carry .gpu/p2:  bash tools/gpu_check_remote.sh part 2
#     call 3, carry .gpu/p3:  bash tools/gpu_check_remote.sh run --plans DLRM-50=.gpu/p3/my_plans.jsonl ...
#       e.g. the honest-margin plans:  R=results/honest_margins/2026-11-28; bash tools/gpu_check_remote.sh run \
#         --alg lookup_greedy --plans DLRM-50=$R/emu_dlrm50.jsonl.gz --plans DLRM-100=$R/emu_dlrm100.jsonl.gz \
#         --noise-repeats 3 --time-budget 550
#   NEXT (not yet measured on a GPU): on one machine, calls 3-5 made at once (only call 3 carries .gpu/p3; FBGEMM
#   is unpacked by then; each run starts a fresh shard file, the previous run's went to its call's $OUT):
#     3. the NS set's plans, every planner (4 devices, dims 4-128, 0.5 GB; ~110 plans, ~200 s):
#          R=results/honest_margins/2026-11-29b; bash tools/gpu_check_remote.sh run --alg lookup_greedy --sets NS \
#            --plans NS=$R/emu_ns.jsonl.gz --noise-repeats 3 --time-budget 300
#     4. shardkit's DLRM plans replanned with its replica bias per device count and the replica law's cost per
#        replica (2026-11-29), beside TorchRec's and NeuroShard's (its anchor pre-trained on every table since
#        2026-11-29b: plans run 6 never measured)
#        (TorchRec's plans are those run 6 measured; ~70 plans, ~200 s):
#          bash tools/gpu_check_remote.sh run --alg lookup_greedy --plans-algs shardkit,torchrec,neuroshard \
#            --plans DLRM-50=$R/emu_dlrm50.jsonl.gz --plans DLRM-100=$R/emu_dlrm100.jsonl.gz --noise-repeats 3 \
#            --time-budget 300
#     5. cost-model data no test task's held-out judge leaves out (a DLRM-100 task's judge keeps 157 shards today):
#        training-pool tasks' plans, random and special shards of the training pool's tables (~300 s):
#          T=results/train_pool_plans/2026-11-28; bash tools/gpu_check_remote.sh run --alg lookup_greedy \
#            --sets DLRM-50-train,DLRM-100-train --max-tasks 4 --plans DLRM-50-train=$T/emu_dlrm50_train.jsonl.gz \
#            --plans DLRM-100-train=$T/emu_dlrm100_train.jsonl.gz --random-shards 100 --special-shards 30 \
#            --shard-pool train --noise-repeats 3 --time-budget 330
#   With ~36 s for calls 1-2 that is ~800 of a session's 900 s: drop a part rather than squeeze the budgets.
#   Register each run in shardcore/oracles/emulated/emulator.py (GPUCHECK_RUNS, SHARD_FILES, PIECE_FILES) only
#   when it should join the fit: 3 and 4 are tests of the judge (keep them out, as runs 6-7), 5 is fit data.
#
# Timing on 2026-11-28 (runs 6 and 7): a fresh machine started and ran call 1 in ~31 s of device time, call 2
# took ~5 s, and run's wait for the dataset (~40-47 s) overlaps the turnaround; all ten planners' plans of
# both sets with 60 special shards took 490 s (about 2.3 s per plan, measured once; the confirmation of each
# plan's slowest device, default since, adds one shard per plan: 12-25% more), and 5 tasks x 3 planners per
# set 147 s in all. A second machine with 251 s left sufficed for that 15-plan repeat per set.
#
# "run" waits for the dataset (by its pid: never `pgrep -f`, which matches the waiting shell itself),
# unpacks FBGEMM into /tmp/site, runs tools/gpu_check.py --work-dir /tmp/gc with the flags given and
# copies gpu_check.json, its log and the measured shard files to $OUT. Set the check's --time-budget
# well inside the call's timeout. See docs/oracles.md ("GPU checks").
set -u
mode=${1:-}
case "$mode" in
  split)
    dir=${2:?usage: gpu_check_remote.sh split DIR (the folder stage-fbgemm-gpu.sh wrote)}
    [ -f "$dir/a/part.00" ] && [ -f "$dir/b/part.01" ] || { echo "error: $dir/a/part.00 and $dir/b/part.01 not found (run stage-fbgemm-gpu.sh $dir first)" >&2; exit 2; }
    tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
    cat "$dir/a/part.00" "$dir/b/part.01" > "$tmp/all" && (cd "$tmp" && split -n 3 -d all fbx.) || exit 1
    mkdir -p "$dir/p1" "$dir/p2" "$dir/p3"
    mv "$tmp/fbx.00" "$dir/p1/" && mv "$tmp/fbx.01" "$dir/p2/" && mv "$tmp/fbx.02" "$dir/p3/" || exit 1
    rm -rf "$dir/a" "$dir/b"
    ls -l "$dir"/p1 "$dir"/p2 "$dir"/p3
    ;;
  part)
    n=${2:?usage: gpu_check_remote.sh part 1|2}
    mkdir -p /tmp/fb /tmp/gc && cp .gpu/p"$n"/fbx.* /tmp/fb/ || { echo "error: .gpu/p$n not carried" >&2; exit 2; }
    if [ "$n" = 1 ] && [ ! -f /tmp/gc/data_b65536/data.pt ]; then
      PYTHONPATH=$PWD setsid bash -c 'echo $$ > /tmp/gen.pid; exec python3 tools/gen_dlrm_data.py --synthetic \
        --out-dir /tmp/gc/data_b65536 --batch-size 65536 --quiet' > /tmp/gen.log 2>&1 < /dev/null &
    fi
    nvidia-smi -L 2>/dev/null; ls -l /tmp/fb
    ;;
  run)
    shift
    if [ -f /tmp/gen.pid ]; then
      while kill -0 "$(cat /tmp/gen.pid)" 2>/dev/null; do sleep 1; done
      cat /tmp/gen.log
    fi
    if [ ! -f /tmp/site/fbgemm_gpu/__init__.py ]; then
      mkdir -p /tmp/site
      cat /tmp/fb/fbx.00 /tmp/fb/fbx.01 .gpu/p3/fbx.02 | xz -dc -T0 | tar x -C /tmp/site || { echo "error: unpacking FBGEMM failed" >&2; exit 3; }
    fi
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    # a run's shard files hold its own measurements only: an earlier run's (copied to its call's $OUT) set aside
    mkdir -p /tmp/gc/earlier && for f in /tmp/gc/measured_shards*.jsonl; do
      [ -f "$f" ] && mv "$f" "/tmp/gc/earlier/$(date +%s)_$(basename "$f")"; done
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
    # FBGEMM 1.6 warns in every worker that its compatibility table has no 1.6 entry: left out of the log
    python3 tools/gpu_check.py --work-dir /tmp/gc "$@" 2>&1 \
      | grep -v -F -e "_fbgemm_torch_compat_table" -e "cannot determine compatibility" -e "WARNING:root:" -e $'\e[' \
      | tee "${OUT:-/tmp}/gpu_check.log"
    rc=${PIPESTATUS[0]}
    for f in /tmp/gc/gpu_check.json /tmp/gc/measured_shards*.jsonl; do [ -f "$f" ] && cp "$f" "${OUT:-/tmp}/"; done
    exit "$rc"
    ;;
  *)
    echo "usage: gpu_check_remote.sh split DIR | part 1|2 | run [tools/gpu_check.py flags]" >&2
    exit 2
    ;;
esac
