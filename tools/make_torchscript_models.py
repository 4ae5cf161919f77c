#!/usr/bin/python3
"""Writes small TorchScript models, each with the config.json vramgate reads.

    tools/make_torchscript_models.py OUT_DIR [--reference] [--seed N]

Makes, under OUT_DIR:
  image_classifier/  a small CNN over batch x 3 x H x W -> batch x 10 logits
  image_to_image/    a residual conv net, batch x 3 x H x W -> the same shape;
                     its activations (and so its memory) grow with H x W, a
                     stand-in for one denoiser step of an image model
  audio_classifier/  a 1-D conv net over batch x samples -> batch x 6 logits
  audio_enhancer/    a causal 1-D conv net, batch x samples -> the same shape;
                     each output sample depends only on the input up to it,
                     so zeros appended at the end change nothing before them:
                     its config.json declares "samples" paddable
Each folder holds model.pt (torch.jit.trace of the module, weights seeded)
and config.json. With --reference each folder also gets reference.json: an
input at a shape other than the one traced and the output the TorchScript
module gives for it (what the C++ tests compare against).

Runs with /usr/bin/python3 and Debian's python3-torch.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn


class ImageClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.head = nn.Linear(16, 10)

    def forward(self, image):
        x = torch.relu(self.conv1(image))
        x = torch.relu(self.conv2(x))
        x = x.mean(dim=(2, 3))
        return self.head(x)


class ImageToImage(nn.Module):
    """Residual denoiser-like step: the 16-channel activations at full
    resolution make its peak memory grow linearly with H x W."""

    def __init__(self, width=16):
        super().__init__()
        self.inp = nn.Conv2d(3, width, 3, padding=1)
        self.mid = nn.Conv2d(width, width, 3, padding=1)
        self.out = nn.Conv2d(width, 3, 3, padding=1)

    def forward(self, image):
        x = torch.relu(self.inp(image))
        x = torch.relu(self.mid(x))
        return image - 0.1 * self.out(x)


class AudioClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(1, 8, 9, stride=2, padding=4)
        self.conv2 = nn.Conv1d(8, 16, 9, stride=2, padding=4)
        self.head = nn.Linear(16, 6)

    def forward(self, audio):
        x = torch.relu(self.conv1(audio.unsqueeze(1)))
        x = torch.relu(self.conv2(x))
        return self.head(x.mean(dim=2))


class AudioEnhancer(nn.Module):
    """Causal: every convolution is padded on the left only, so output sample
    t sees input samples <= t. Requests of different lengths padded with zeros
    at the end and run together give each one its own output on its own
    samples (vramgate crops the rest off)."""

    def __init__(self, width=8, kernel=9):
        super().__init__()
        self.kernel = kernel
        self.inp = nn.Conv1d(1, width, kernel)
        self.mid = nn.Conv1d(width, width, kernel)
        self.out = nn.Conv1d(width, 1, kernel)

    def causal(self, conv, x):
        return conv(F.pad(x, (self.kernel - 1, 0)))

    def forward(self, audio):
        x = torch.relu(self.causal(self.inp, audio.unsqueeze(1)))
        x = torch.relu(self.causal(self.mid, x))
        return audio + 0.1 * self.causal(self.out, x).squeeze(1)


# The ranges keep every convolution above 20480 input elements, where
# libtorch's CPU convolution always takes its oneDNN path: below it, a batch
# of one takes the im2col path, whose column buffer makes the peak memory of
# small inputs jump off the line the memory profile fits (see docs/models.md).
IMAGE_DIMS = {"batch": {"max": 16}, "height": {"min": 96, "max": 256}, "width": {"min": 96, "max": 256}}

MODELS = {
    "image_classifier": {
        "module": ImageClassifier,
        "trace_shape": [1, 3, 128, 128],
        "reference_shape": [2, 3, 100, 120],
        "config": {
            "model_type": "torchscript",
            "inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, "height", "width"]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
            "dims": IMAGE_DIMS,
            "pad": [],
        },
    },
    "image_to_image": {
        "module": ImageToImage,
        "trace_shape": [1, 3, 128, 128],
        "reference_shape": [2, 3, 97, 110],
        "config": {
            "model_type": "torchscript",
            "inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, "height", "width"]}],
            "outputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, "height", "width"]}],
            "dims": IMAGE_DIMS,
            "pad": [],
        },
    },
    "audio_classifier": {
        "module": AudioClassifier,
        "trace_shape": [1, 32000],
        "reference_shape": [3, 25000],
        "config": {
            "model_type": "torchscript",
            "inputs": [{"name": "audio", "dtype": "float32", "shape": ["batch", "samples"]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 6]}],
            "dims": {"batch": {"max": 16}, "samples": {"min": 24000, "max": 96000}},
            "pad": [],
        },
    },
    "audio_enhancer": {
        "module": AudioEnhancer,
        "trace_shape": [1, 32000],
        "reference_shape": [2, 25000],
        "config": {
            "model_type": "torchscript",
            "inputs": [{"name": "audio", "dtype": "float32", "shape": ["batch", "samples"]}],
            "outputs": [{"name": "audio", "dtype": "float32", "shape": ["batch", "samples"]}],
            "dims": {"batch": {"max": 16}, "samples": {"min": 24000, "max": 96000}},
            "pad": ["samples"],
        },
    },
}


def write_model(out_dir, name, spec, seed, reference):
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(seed)
    module = spec["module"]().eval()
    example = torch.randn(*spec["trace_shape"])
    with torch.no_grad():
        traced = torch.jit.trace(module, (example,))
    traced.save(os.path.join(folder, "model.pt"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(spec["config"], f, indent=2)
        f.write("\n")
    if reference:
        loaded = torch.jit.load(os.path.join(folder, "model.pt"))
        x = torch.randn(*spec["reference_shape"], generator=torch.Generator().manual_seed(seed + 1))
        with torch.no_grad():
            y = loaded(x)
        ref = {
            "inputs": [{"name": spec["config"]["inputs"][0]["name"], "shape": list(x.shape),
                        "data": x.flatten().tolist()}],
            "outputs": [{"name": spec["config"]["outputs"][0]["name"], "shape": list(y.shape),
                         "data": y.flatten().tolist()}],
        }
        with open(os.path.join(folder, "reference.json"), "w") as f:
            json.dump(ref, f)
    return folder


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--reference", action="store_true", help="also write reference.json per model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", choices=sorted(MODELS), help="write only these models")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.only or sorted(MODELS):
        print(write_model(args.out_dir, name, MODELS[name], args.seed, args.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
