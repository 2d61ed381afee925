"""ONNX Runtime against torch for decoding, on this CPU (``captioner export --onnx``, ``--runtime onnx``).

The decoders of the COCO recipes at their sizes (VGG-19 regions, 14 x 14 x 512; a 10,000-word vocabulary): the soft
and hard LSTM (``coco_soft``, ``coco_hard``) and the Transformer (``coco_transformer``), random weights with
``<end>`` made impossible so that every caption runs its full 20 words in both runtimes. Each is exported to ONNX
exactly as ``captioner export --onnx`` exports it, then decoded greedily and with a beam of 3, for 1 and 16 images at
a time, by the one search of captioner driving the torch decoder and then the ONNX Runtime one: the same code,
only the per-word step differs. The two are timed in alternation (the order swapped each round) and the ratio is
taken round by round: ``speed_up`` = torch time / ONNX Runtime time (above 1: ONNX Runtime is faster), median with
its min-max. The encoders too: VGG-19 at 224 px and MobileNetV2 at 128 px (the demo's), images per second.

    python benchmarks/bench_onnx.py [--quick] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from common import END, add_arguments, machine_facts, setup

from captioner.results.record import report

from captioner.config import load_config
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import DecodeConfig, decode
from captioner.export.onnx import ENCODER, OnnxDecoder, OnnxEncoder, export_onnx, require_onnx
from captioner.checkpoint import build_model

VOCAB = 10_000
WORDS = 20
RECIPES = ("coco_soft", "coco_hard", "coco_transformer")   # the decoders measured, at these recipes' sizes


def timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def alternate(first, second, rounds: int) -> dict:
    """Time ``first`` and ``second`` in alternation, ``rounds`` times each after one warm-up of each; the ratio of
    their times round by round."""
    first(), second()
    ratios, times = [], ([], [])
    for index in range(rounds):
        pair = (first, second) if index % 2 == 0 else (second, first)
        seconds = [timed(f) for f in pair]
        if index % 2:
            seconds.reverse()
        times[0].append(seconds[0])
        times[1].append(seconds[1])
        ratios.append(seconds[0] / seconds[1])
    return {"torch_ms": round(1000 * statistics.median(times[0]), 2), "onnx_ms": round(1000 * statistics.median(times[1]), 2),
            "speed_up": round(statistics.median(ratios), 3), "speed_up_range": [round(min(ratios), 3), round(max(ratios), 3)]}


def bench_decoder(recipe: str, rounds: int, batches: tuple[int, ...]) -> dict:
    config = load_config(recipe, ["encoder.pretrained=false", f"decode.max_length={WORDS}", "decode.min_length=0"])
    model = build_model(config, VOCAB, pretrained=False).eval()
    with torch.no_grad():
        model.decoder.out_words.bias[END] = float("-inf")        # every caption runs its full WORDS words
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)])
    regions = torch.randn(max(batches), *model.encoder.grid, model.encoder.feature_dim).flatten(1, 2)
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        described = export_onnx(model, Path(folder))
        export_seconds = time.perf_counter() - started
        onnx = OnnxDecoder(Path(folder), described, model.decoder.samples_locations)
        result = {"export_s": round(export_seconds, 1)}
        for beam in (1, 3):
            decode_config = DecodeConfig.of(config, beam=beam)
            for batch in batches:
                torch_captions, onnx_captions = [], []

                def run(decoder, out):
                    with torch.inference_mode():
                        out[:] = [g.tokens for g in decode(decoder, regions[:batch], vocab, decode_config)]

                measured = alternate(lambda: run(model.decoder, torch_captions), lambda: run(onnx, onnx_captions), rounds)
                measured["same_captions"] = torch_captions == onnx_captions
                measured["words"] = WORDS
                result[f"{'greedy' if beam == 1 else f'beam{beam}'}_batch{batch}"] = measured
    return result


def bench_encoder(name: str, size: int, batch: int, rounds: int) -> dict:
    config = load_config(None, [f"encoder.name={name}", "encoder.pretrained=false", f"encoder.image_size={size}"])
    model = build_model(config, 10, pretrained=False).eval()
    model.encoder.prepare_for_inference()
    images = torch.rand(batch, 3, size, size)
    with tempfile.TemporaryDirectory() as folder:
        export_onnx(model, Path(folder))
        onnx = OnnxEncoder(Path(folder) / ENCODER, model.encoder)
        with torch.inference_mode():
            difference = float((onnx(images) - model.encoder(images)).abs().max())
            measured = alternate(lambda: model.encoder(images), lambda: onnx(images), rounds)
    measured.update(batch=batch, images_per_s_torch=round(batch / measured["torch_ms"] * 1000, 1),
                    images_per_s_onnx=round(batch / measured["onnx_ms"] * 1000, 1), max_abs_difference=difference)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, device=False)
    args = parser.parse_args()
    setup(args)
    require_onnx()
    import onnxruntime

    rounds = 3 if args.quick else 7
    result = {"machine": {**machine_facts(), "onnxruntime": onnxruntime.__version__,
                          "onnxruntime_threads": torch.get_num_threads()},
              "vocabulary": VOCAB, "regions": "14 x 14 x 512 (VGG-19 conv5_4)", "decoders": {}, "encoders": {}}
    for recipe in RECIPES:
        result["decoders"][recipe] = bench_decoder(recipe, rounds, (1, 4) if args.quick else (1, 16))
    result["encoders"]["vgg19_224px"] = bench_encoder("vgg19", 224, 1 if args.quick else 4, rounds)
    result["encoders"]["mobilenet_v2_128px"] = bench_encoder("mobilenet_v2", 128, 16, rounds)
    report("onnx", result, configs=list(RECIPES),
           probes=[f"decode {name} data.features=features" for name in RECIPES])


if __name__ == "__main__":
    main()
