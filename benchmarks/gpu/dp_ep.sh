#!/usr/bin/env bash
# -dp 2 --enable-expert-parallel on two GPUs (NCCL), a step of benchmarks/gpu_check.sh:
# a random bf16 Mixtral (8 experts, top-2, hidden 1024, 4 layers) with MODEL_DIR's tokenizer,
# served by two engines whose experts are spread over both GPUs (4 each; tokens travel by
# all-to-all), then 16 requests through `octavo bench serve`; the server is stopped after.
#   benchmarks/gpu/dp_ep.sh PYTHON MODEL_DIR LOG_DIR
set -uo pipefail
PY=$1 MODEL=$2 LOGS=$3
MIXTRAL=.gpu/mixtral
PORT=8791
"$PY" - "$MODEL" "$MIXTRAL" <<'EOF' || exit 1
import sys

import torch
from transformers import AutoTokenizer, MixtralConfig, MixtralForCausalLM

source, folder = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(source)
torch.manual_seed(0)
config = MixtralConfig(vocab_size=len(tokenizer), hidden_size=1024, intermediate_size=2816,
                       num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                       num_local_experts=8, num_experts_per_tok=2,
                       max_position_embeddings=4096)
MixtralForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
tokenizer.save_pretrained(folder)
print("random Mixtral written to", folder)
EOF
"$PY" -m octavo serve --model "$MIXTRAL" --backend cuda -dp 2 --enable-expert-parallel \
    --max-model-len 1024 --host 127.0.0.1 --port "$PORT" > "$LOGS/dp_ep_serve.log" 2>&1 &
server=$!
stop() { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; }
trap stop EXIT
for _ in $(seq 150); do
    if "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health')" \
            2>/dev/null; then
        break
    fi
    if ! kill -0 "$server" 2>/dev/null; then
        echo "the server exited:"; tail -n 20 "$LOGS/dp_ep_serve.log"; exit 1
    fi
    sleep 1
done
"$PY" -m octavo bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 16 \
    --random-input-len 64 --random-output-len 16 --disable-tqdm \
    --save-result "$LOGS/dp_ep_serve.json"
