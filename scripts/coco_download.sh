#!/usr/bin/env bash
# Download MS-COCO 2014 (images, caption and instance annotations) and Karpathy's split file into
# data/coco, on a machine with internet. About 20 GB of downloads and 20 GB unpacked; resumable (curl -C -),
# and files already unpacked are kept. Never run by the tests.
#
#   scripts/coco_download.sh [DEST]          (default DEST: data/coco)
#
# Result: DEST/train2014/*.jpg, DEST/val2014/*.jpg, DEST/annotations/{captions,instances}_{train,val}2014.json,
# DEST/dataset_coco.json (the Karpathy split: 113,287 train+restval, 5,000 val, 5,000 test images).
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-data/coco}"
mkdir -p "$dest/downloads"

fetch() {  # URL -> DEST/downloads/NAME, resuming a partial download
    local url="$1" file="$dest/downloads/$(basename "$1")"
    echo "fetching $url"
    curl --fail --location --retry 5 -C - -o "$file" "$url"
}

unpack() {  # ZIP [FILES...]: unzip into DEST without overwriting what is there
    unzip -q -n "$@" -d "$dest"
}

free_gb=$(df -Pk "$dest" | awk 'NR == 2 {print int($4 / 1048576)}')
if [ "$free_gb" -lt 45 ]; then
    echo "coco_download: $dest has ${free_gb} GB free; about 45 GB are needed (downloads + unpacked)" >&2
    exit 1
fi

fetch http://images.cocodataset.org/annotations/annotations_trainval2014.zip
unpack "$dest/downloads/annotations_trainval2014.zip"
fetch https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip
unpack "$dest/downloads/caption_datasets.zip" dataset_coco.json
for part in train2014 val2014; do
    if [ ! -d "$dest/$part" ] || [ "$(find "$dest/$part" -name '*.jpg' | wc -l)" -lt 40000 ]; then
        fetch "http://images.cocodataset.org/zips/$part.zip"
        unpack "$dest/downloads/$part.zip"
    fi
done
echo "train2014: $(find "$dest/train2014" -name '*.jpg' | wc -l) images, val2014: $(find "$dest/val2014" -name '*.jpg' | wc -l)"
echo "the zip files in $dest/downloads can be deleted now (about 20 GB)"
