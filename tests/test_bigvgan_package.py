"""The vocoder's import of the `bigvgan` package without its training utilities (services/vocoder/bigvgan_package.py):
the same generator as the whole package builds, none of librosa, scipy.signal or matplotlib loaded, and the package
still whole for anyone who asks it for more."""

from __future__ import annotations

import json
import subprocess
import sys

import bigvgan  # this process: the whole package, as a user's script would have it
import torch

from services.vocoder import generator

IN_A_VOCODER = """
import json, sys, torch
from services.vocoder import generator
h = generator.preset_config("tiny")
model = generator.build_generator(h, seed=3)
with torch.no_grad():
    audio = model(torch.randn(1, h["num_mels"], 12, generator=torch.Generator().manual_seed(4)))
torch.save({"weights": model.state_dict(), "audio": audio}, sys.argv[1])
heavy = [m for m in ("bigvgan.meldataset", "librosa", "matplotlib", "scipy.signal") if m in sys.modules]
import bigvgan                                        # later, elsewhere in the process: the package completes itself
whole = bigvgan.BigVGAN is bigvgan.bigvgan.BigVGAN and callable(bigvgan.get_mel_spectrogram)
print(json.dumps({"heavy": heavy, "whole": whole, "after": "bigvgan.meldataset" in sys.modules}))
"""


def test_the_vocoders_import_builds_the_packages_generator_without_its_training_imports(tmp_path):
    weights = tmp_path / "tiny.pt"
    done = subprocess.run([sys.executable, "-c", IN_A_VOCODER, str(weights)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"heavy": [], "whole": True, "after": True}

    # here bigvgan.utils is the package's own: the same random weights (init_weights) and the same audio (get_padding)
    assert "plot_spectrogram" in vars(bigvgan.utils)
    h = generator.preset_config("tiny")
    model = generator.build_generator(h, seed=3)
    with torch.no_grad():
        audio = model(torch.randn(1, h["num_mels"], 12, generator=torch.Generator().manual_seed(4)))
    built, expected = torch.load(weights, weights_only=True), model.state_dict()
    assert built["weights"].keys() == expected.keys()
    assert all(torch.equal(built["weights"][k], expected[k]) for k in expected)
    assert torch.equal(built["audio"], audio)
