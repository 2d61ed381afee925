#!/usr/bin/env bash
# A quick Flickr8k recipe (the first 700 train and 100 val photos of data/flickr8k, which `captioner data flickr8k
# --root data/flickr8k` makes) with the paper's VGG-19 encoder, end to end: cache features, train, evaluate on val,
# caption and draw one photo.
# Usage: scripts/flickr8k_dev.sh [RECIPE] [EPOCHS]
#   RECIPE: flickr8k_soft (default: soft attention) or flickr8k_transformer (the Transformer decoder, same features)
#   EPOCHS: default the recipe's own, its budget: about 8 minutes on 2 cores.
# Never commit what it writes (runs/): the photos and captions are for research use only.
set -euo pipefail
cd "$(dirname "$0")/.."
# captioner and python come from PATH: activate the project's environment (venv or conda) first
recipe="${1:-flickr8k_soft}"
run="runs/$recipe"
captioner cache-features "$recipe" --splits train val
captioner train "$recipe" ${2:+"train.epochs=$2"} --overwrite
captioner evaluate --checkpoint "$run/best.pt" --split val
photos=(data/flickr8k/images/*.jpg)
captioner caption "${photos[@]:0:3}" --checkpoint "$run/best.pt"
captioner attend "${photos[0]}" --checkpoint "$run/best.pt" --out "$run/attention_example.png"
