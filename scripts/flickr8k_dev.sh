#!/usr/bin/env bash
# Soft attention on the Flickr8k development subset (../shared/data/flickr8k-800: 700 train, 100 val images)
# with the paper's VGG-19 encoder, end to end: cache features, train, evaluate on val, caption and draw
# one photo. Usage: scripts/flickr8k_dev.sh [EPOCHS] (default: the config's 16, the recipe's budget: about 10
# minutes on 2 cores). Never commit what it writes (runs/): the photos and captions are for research use only.
set -euo pipefail
cd "$(dirname "$0")/.."
# captioner and python come from PATH: activate the project's environment (venv or conda) first
epochs="${1:-16}"
config=configs/flickr8k_soft.yaml
captioner cache-features "$config" --splits train val
captioner train "$config" "train.epochs=$epochs" --overwrite
captioner evaluate runs/flickr8k_soft/best.pt --split val
photos=(../shared/data/flickr8k-800/images/*.jpg)
captioner caption "${photos[@]:0:3}" --checkpoint runs/flickr8k_soft/best.pt
captioner attend "${photos[0]}" --checkpoint runs/flickr8k_soft/best.pt \
    --out runs/flickr8k_soft/attention_example.png
