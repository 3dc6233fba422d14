#!/usr/bin/env bash
# Create .venv-verl: verl 0.9.1 (+ what importing its policy-loss path needs) and p3o, for tests/integrations/test_verl.py.
#   bash scripts/verl_env.sh            # creates (or refreshes) .venv-verl next to .venv
#   VERL_VENV=/tmp/v bash scripts/verl_env.sh
# verl 0.9.1 pins transformers<5.11, which p3o's main .venv does not, hence a virtualenv of its own. It stays lean:
# verl itself is installed with --no-deps and only the packages that `import verl`, verl.trainer.ppo.core_algos
# and verl.workers.utils.losses (verl's per-micro-batch loss call site) import are added — not vllm, sglang,
# flash-attn, wandb, tensorboard, peft, torchdata or ray[default]'s dashboard extras. CPU torch comes from
# constraints-cpu.txt like the main .venv. p3o is installed editable with --no-deps (its objectives need torch only).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VERL_VENV:-.venv-verl}"
PY="${PY:-python3}"
start=$(date +%s)

if ! "$VENV/bin/python" -c "import verl" >/dev/null 2>&1; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -c constraints-cpu.txt \
        torch "transformers>=5.5.3,<5.11,!=5.6.0" "numpy>=2" packaging omegaconf hydra-core \
        "tensordict>=0.8,!=0.9.0,<=0.10.0" ray codetiming datasets pillow
    "$VENV/bin/pip" install -q --no-deps "verl==0.9.1"
fi
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/python" - <<'EOF'
import p3o.integrations.verl as plugin
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.utils.losses import ppo_loss  # noqa: F401  (the call site imports)

for name in plugin.LOSS_MODES:
    get_policy_loss_fn(name)
print(f"verl policy losses registered: {', '.join(plugin.LOSS_MODES)}")
EOF
echo "$VENV ready in $(( $(date +%s) - start )) s"
