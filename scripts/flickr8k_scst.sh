#!/usr/bin/env bash
# Self-critical fine-tuning on the quick Flickr8k subset (of data/flickr8k), from the cross-entropy model of
# scripts/flickr8k_dev.sh (runs/flickr8k_soft/best.pt): train, then score both on the 100 validation photos
# with beam 3 (CIDEr, diversity, dangling endings: runs/*/scores_val.json). Usage: scripts/flickr8k_scst.sh
# [EPOCHS] (default 10). Never commit what it writes (runs/): the photos are for research use only.
set -euo pipefail
cd "$(dirname "$0")/.."
# captioner and python come from PATH: activate the project's environment (venv or conda) first
epochs="${1:-10}"
test -f runs/flickr8k_soft/best.pt || scripts/flickr8k_dev.sh
captioner train configs/flickr8k_soft_scst.yaml "train.epochs=$epochs" --overwrite
for run in flickr8k_soft flickr8k_soft_scst; do
    captioner evaluate --checkpoint "runs/$run/best.pt" --split val --out "runs/$run" > /dev/null
    python -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[2], {k: round(s[k], 3) for k in ('BLEU-4', 'METEOR', 'CIDEr')}, {k: round(v, 3) for k, v in s['diversity'].items()})" "runs/$run/scores_val.json" "$run"
done
