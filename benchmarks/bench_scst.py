"""Self-critical training at the paper's sizes: images per second of a full step (B = 32 images x 5 sampled
captions, L = 196 regions of D = 512, LSTM sizes 512, 10,000 words, captions of up to 16 words), and the share
of the step spent on each part: sampling (the forward pass with its graph), the CIDEr-D reward of the 160
captions against 5 references each, the greedy captions when that baseline is used, and backward + Adam.

    python benchmarks/bench_scst.py [--quick] [--threads N] [--device auto]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from common import RULES, VOCAB, add_arguments, setup, synchronise

from captioner.data.tokens import SPECIALS
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import sample_captions
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.objectives.rewards import CiderD
from captioner.objectives.scst import caption_words, mean_of_others, policy_loss
from captioner.results.record import report

IMAGES, SAMPLES, REFERENCES, MAX_LENGTH = 32, 5, 5, 16


def synthetic_references(images: int, generator: torch.Generator) -> dict[int, list[list[str]]]:
    """5 captions of 8-16 words per image, drawn from a 10,000-word vocabulary."""
    return {i: [[f"w{int(w)}" for w in torch.randint(4, VOCAB, (int(torch.randint(8, 17, (1,), generator=generator)),),
                                                          generator=generator)] for _ in range(REFERENCES)]
            for i in range(images)}


def timed(device: torch.device, work):
    synchronise(device)
    started = time.perf_counter()
    out = work()
    synchronise(device)
    return out, time.perf_counter() - started


def one_step(decoder, features, cider, vocab, optimizer, device, greedy_baseline: bool) -> dict[str, float]:
    """One self-critical step, each part timed."""
    image_ids = list(range(features.shape[0]))
    drawn, sample_s = timed(device, lambda: sample_captions(decoder, features, rules=RULES, max_length=MAX_LENGTH,
                                                            samples=SAMPLES))
    repeated = [i for i in image_ids for _ in range(SAMPLES)]
    rewards, reward_s = timed(device, lambda: torch.from_numpy(
        cider.scores(caption_words(drawn.tokens, vocab), repeated)).float().to(device))
    greedy_s = 0.0
    if greedy_baseline:
        def greedy():
            with torch.no_grad():
                decoder.eval()
                best = sample_captions(decoder, features, rules=RULES, max_length=MAX_LENGTH, temperature=0)
                decoder.train()
            return cider.scores(caption_words(best.tokens, vocab), image_ids)
        _, greedy_s = timed(device, greedy)
    baseline = mean_of_others(rewards, SAMPLES)

    def update():
        loss = policy_loss(rewards - baseline, drawn.log_probs, drawn.mask.float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    _, update_s = timed(device, update)
    return {"sample": sample_s, "reward": reward_s, "greedy": greedy_s, "backward_and_adam": update_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    generator = torch.Generator().manual_seed(0)
    vocab = Vocabulary([*SPECIALS] + [f"w{i}" for i in range(len(SPECIALS), VOCAB)])
    cider = CiderD(synthetic_references(IMAGES, generator), count_end=True)
    decoder = LSTMDecoder(LSTMDecoderConfig(vocab_size=VOCAB, region_dim=512, grid=(14, 14))).to(device).train()
    features = torch.randn(IMAGES, 196, 512, generator=generator).to(device)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-5)
    steps = 2 if args.quick else 5
    result = {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "machine": platform.machine(), "images": IMAGES, "samples_per_image": SAMPLES, "max_length": MAX_LENGTH}
    for name, greedy_baseline in (("mean_baseline", False), ("greedy_baseline", True)):
        one_step(decoder, features, cider, vocab, optimizer, device, greedy_baseline)   # warm-up
        parts = [one_step(decoder, features, cider, vocab, optimizer, device, greedy_baseline) for _ in range(steps)]
        seconds = {k: sum(p[k] for p in parts) / steps for k in parts[0]}
        total = sum(seconds.values())
        result[name] = {"images_per_s": round(IMAGES / total, 2), "step_s": round(total, 3),
                        "share": {k: round(v / total, 3) for k, v in seconds.items()}}
    configs = ["defaults train.objective=scst", "defaults train.objective=scst train.scst_baseline=greedy"]
    report("scst", result, configs=configs, probes=[f"train {c} data.features=features" for c in configs])


if __name__ == "__main__":
    main()
