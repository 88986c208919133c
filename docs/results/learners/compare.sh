#!/usr/bin/env bash
# The learner comparison: PPO, SAC and DDQN+PER trained on the same training families, seed and
# steps, one after the other (so each training time is its own), then evaluated with the
# heuristic and the shipped policy on the same scenarios of every family.
# Usage: docs/results/learners/compare.sh [STEPS] [SEED]   (from the repository root, extra rl)
set -euo pipefail
steps=${1:-150000}
seed=${2:-0}
out=docs/results/learners
for learner in ppo sac ddqn; do
    .venv/bin/drapps train-policy --learner "$learner" --steps "$steps" --seed "$seed" \
        --episodes 0 --out "$out/$learner.npz" | tee "$out/train-$learner.txt"
done
.venv/bin/drapps evaluate-policy --policies "heuristic,rl,$out/ppo.npz,$out/sac.npz,$out/ddqn.npz" \
    --episodes 8 --seed "$seed" --out "$out/eval" | tee "$out/eval.txt"
.venv/bin/python docs/results/learners/table.py "$out" > "$out/table.md"
cat "$out/table.md"
