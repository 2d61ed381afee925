#!/usr/bin/env bash
# Prepare MS-COCO (after scripts/coco_download.sh) for the configs/coco_*.yaml runs: build the shared
# vocabulary (words seen 5+ times in the Karpathy train captions) and cache VGG-19 conv5_4 features of
# all 123,287 images (14 x 14 x 512 fp16 memory map, about 25 GB; resumable: run it again after an
# interruption and it continues). Uses the GPU when there is one. Never run by the tests.
#
#   scripts/coco_prepare.sh [CONFIG]          (default CONFIG: configs/coco_soft.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-configs/coco_soft.yaml}"
captioner=.venv/bin/captioner
$captioner data vocab "$config"
$captioner cache-features "$config" --splits train val test --batch-size 64 data.num_workers=8
echo "next: $captioner train $config   (or torchrun --nproc_per_node=N -m captioner train $config)"
