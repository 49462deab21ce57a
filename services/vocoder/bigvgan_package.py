"""The `bigvgan` package's inference modules, imported without its training utilities.

The package's `__init__` and its `utils` module import librosa, scipy.signal and matplotlib (for mel datasets and
spectrogram plots): ~2.4 s of a vocoder's ~5 s start on CPU, for nothing inference runs. `model_module()` enters the
package without running its `__init__` and gives `bigvgan.bigvgan` the two helpers it takes from `utils`
(`init_weights`, `get_padding`, as the package defines them: tests/test_bigvgan_package.py holds them to it). The
package completes itself the first time anything asks it for a name it does not have yet (`import bigvgan;
bigvgan.BigVGAN` elsewhere in the process still works); where the whole package is imported already, it is used as is.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def model_module() -> types.ModuleType:
    """→ `bigvgan.bigvgan` (the BigVGAN class; `bigvgan.env`, `bigvgan.activations` import as usual beside it)."""
    if "bigvgan.bigvgan" not in sys.modules and "bigvgan" not in sys.modules:
        _enter_package()
    return importlib.import_module("bigvgan.bigvgan")


def _enter_package() -> None:
    spec = importlib.util.find_spec("bigvgan")
    if spec is None:
        raise ModuleNotFoundError("the vocoder needs the `bigvgan` package (pip install --no-deps bigvgan==2.4.1)")
    package = importlib.util.module_from_spec(spec)  # __path__ set, __init__ not run
    completing = []

    def complete(name: str):
        """PEP 562: a name the bare package lacks runs its __init__ once (meldataset's librosa included), then looks
        again; not for a dunder or a submodule's name (`from . import activations` asks for it first)."""
        if completing or name.startswith("__") or importlib.util.find_spec(f"bigvgan.{name}") is not None:
            raise AttributeError(name)
        completing.append(name)
        spec.loader.exec_module(package)
        if name in package.__dict__:
            return package.__dict__[name]
        raise AttributeError(f"module 'bigvgan' has no attribute {name!r}")

    package.__getattr__ = complete
    sys.modules["bigvgan"] = package
    package.utils = sys.modules.setdefault("bigvgan.utils", _inference_utils())


def _inference_utils() -> types.ModuleType:
    """What bigvgan/bigvgan.py takes from bigvgan/utils.py, without that module's imports."""
    utils = types.ModuleType("bigvgan.utils", "bigvgan.utils' inference helpers (services/vocoder/bigvgan_package.py)")

    def init_weights(m, mean=0.0, std=0.01):
        if m.__class__.__name__.find("Conv") != -1:
            m.weight.data.normal_(mean, std)

    def get_padding(kernel_size, dilation=1):
        return int((kernel_size * dilation - dilation) / 2)

    utils.init_weights, utils.get_padding = init_weights, get_padding
    return utils
