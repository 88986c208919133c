#!/bin/bash
# Interleaved A/B: the runtime before its split into parts (BEFORE: a worktree of e99bee2,
# `git worktree add $BEFORE e99bee2`, with the built src/drapps/ops/_jpeg_region*.so copied in)
# and after (this checkout), 5 rounds, each run a fresh process. Results in /tmp/ab.
set -eu
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/ab
for round in 1 2 3 4 5; do
  for side in before after; do
    src=$PWD/src; [ $side = before ] && src=$BEFORE/src
    for wl in image stragglers; do
      PYTHONPATH=$src .venv/bin/drapps bench --workload $wl --scenario steady \
        --systems drapps-static,drapps-heuristic --static-workers 2 --consumer none \
        --repeats 1 --size quick --data-dir /tmp/ab-data --out /tmp/ab/$side-$wl-$round --no-progress \
        > /tmp/ab/$side-$wl-$round.log 2>&1
    done
  done
done
echo done
