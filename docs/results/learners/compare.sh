#!/usr/bin/env bash
# The learner comparison: PPO, SAC, DDQN+PER and rollout policy iteration trained on the same
# training families and seed, then evaluated with the heuristic and the shipped policy on the
# same scenarios of every family. PPO, SAC and DDQN take STEPS environment steps; rollout policy
# iteration takes ROLLOUT_STEPS, counting the steps of its copies (3 rounds of 100 episodes by
# default), from the heuristic, and one round of 300 episodes from the PPO policy shipped
# before it (which is how the shipped policy was made).
# PPO and the rollouts run alone; SAC and DDQN side by side, one core each: one thread each
# (OMP_NUM_THREADS=1). So run on the 2-core VM they took 7 and 10 minutes, where a try with
# torch's default of two threads each had not finished either in 56.
# Usage: docs/results/learners/compare.sh [STEPS] [SEED] [EPISODES] [ROLLOUT_STEPS]
#   (from the repository root, extra rl)
set -euo pipefail
steps=${1:-150000}
seed=${2:-0}
episodes=${3:-32}
rollout_steps=${4:-1332000}
out=docs/results/learners
train() {
    OMP_NUM_THREADS=1 .venv/bin/drapps train-policy --learner "$1" --steps "$2" --seed "$seed" --episodes 0 \
        --out "$out/$3.npz" "${@:4}" > "$out/train-$3.txt"
}
train ppo "$steps" ppo
train sac "$steps" sac & train ddqn "$steps" ddqn & wait
train rollout "$rollout_steps" rollout
.venv/bin/python docs/results/learners/rollout/train.py "$out/rollout-from-rl.npz" \
    --start "$out/ppo-shipped-before.npz" --rounds 1 --seed "$seed" --evaluate 0 \
    > "$out/train-rollout-from-rl.txt"
.venv/bin/drapps evaluate-policy --episodes "$episodes" --seed "$seed" --out "$out/eval" \
    --policies "heuristic,$out/ppo-shipped-before.npz,$out/ppo.npz,$out/sac.npz,$out/ddqn.npz,$out/rollout.npz,$out/rollout-from-rl.npz" \
    > "$out/eval.txt"
.venv/bin/python docs/results/learners/table.py "$out" > "$out/table.md"
cat "$out/table.md"
