"""Third-party model zoos for benchmarks and capture surveys: torchvision, timm, Hugging Face.

Every model is built with random weights (nothing is downloaded) and put in eval mode.
torchvision, timm and transformers are optional and imported lazily, so this module imports
without them; install them with

    pip install --no-deps torchvision timm transformers

(`--no-deps`, or a pip constraint, keeps pip from replacing the CPU torch with a CUDA one;
timm and transformers then need their pure-Python dependencies: huggingface_hub,
safetensors, tokenizers, pyyaml, regex, tqdm, typer).

The torchvision wheel on PyPI is built against the CUDA torch: beside the CPU torch its
C++ operators (`torchvision/_C.so`: nms, roi_align, ...) fail to load, which torchvision
tolerates, except that `torchvision/_meta_registrations.py` registers fake kernels for
`torchvision::nms` and `torchvision::qnms` unconditionally, so `import torchvision` (and
with it `import timm`, and transformers' vision models) dies with
"RuntimeError: operator torchvision::nms does not exist" (pytorch/vision#9085, #9337).
`import_torchvision()` works around it as torchvision's own proposed fix does (guard those
registrations by whether the ops loaded): when, and only when, `_C` cannot be loaded, the
module `torchvision._meta_registrations` is replaced by an empty one before torchvision is
imported. That module holds nothing but fake/meta kernels for the C++ operators, which do
not exist then, so nothing is lost; the model definitions are pure Python and work, while
`torchvision.ops.nms` and friends raise torchvision's own "Couldn't load custom C++ ops".
No file in site-packages is touched and no torch function is patched.

    python bench/models.py [--flops]      # list the models (and their GFLOPs)
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Callable
from typing import NamedTuple

import torch

INSTALL_HINT = ("pip install -e '.[models]' after the CPU torch (or pip install --no-deps "
                "torchvision timm transformers, plus huggingface_hub safetensors tokenizers "
                "pyyaml regex tqdm typer)")

Inputs = tuple  # example inputs, passed to the model as model(*inputs)
Factory = Callable[[], "tuple[torch.nn.Module, Inputs]"]

_META_MODULE = "torchvision._meta_registrations"


class TorchvisionSpec(NamedTuple):
    """A torchvision classifier: `factory()` builds it, eval mode, random weights."""
    factory: Callable[[], torch.nn.Module]
    input_shape: tuple[int, ...]


def _torchvision_ops_loadable(spec: importlib.machinery.ModuleSpec) -> bool:
    """Whether torchvision's C++ extension `_C` loads beside this torch (found and loaded
    exactly as torchvision.extension does it, without importing torchvision)."""
    finder = importlib.machinery.FileFinder(
        spec.submodule_search_locations[0],
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES))
    ext = finder.find_spec("_C")
    if ext is None or ext.origin is None:
        return False
    try:
        torch.ops.load_library(ext.origin)
    except (ImportError, OSError):
        return False
    return True


def guard_torchvision_import() -> bool:
    """Make a later `import torchvision` (direct, or from timm/transformers) survive C++ ops
    that cannot load; see the module docstring. Returns True when the guard was installed.
    Does nothing when torchvision is absent, already imported, or its ops load."""
    if "torchvision" in sys.modules or _META_MODULE in sys.modules:
        return False
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    if _torchvision_ops_loadable(spec):
        return False
    stub = types.ModuleType(_META_MODULE, "Left out by bench.models: torchvision's C++ ops did "
                            "not load, so there is nothing to register fake kernels for.")
    sys.modules[_META_MODULE] = stub
    return True


def import_torchvision() -> types.ModuleType:
    """Import and return torchvision, guarded as above; ImportError says how to install it."""
    guard_torchvision_import()
    try:
        import torchvision
    except ImportError as err:
        raise ImportError(f"torchvision is not installed: {INSTALL_HINT}") from err
    return torchvision


def _import_optional(name: str) -> types.ModuleType:
    guard_torchvision_import()  # timm imports torchvision; so do some transformers models
    try:
        module = importlib.import_module(name)
    except ImportError as err:
        raise ImportError(f"{name} is not installed: {INSTALL_HINT}") from err
    if name == "transformers":
        _probe_off_bench(module)
    return module


def _probe_off_bench(tf: types.ModuleType) -> None:
    """transformers probes optional packages by their import name (`kernels`: the Hugging
    Face kernel hub) and, finding no metadata for what it found, imports it. A script run
    from bench/ has bench/ on sys.path, where bench/kernels.py is found under that name,
    imported, and the model classes fail to load. The probe is cached: it runs here once
    with bench/ off the path."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if os.path.abspath(p or os.curdir) != here]
    importlib.invalidate_caches()
    try:
        probe = getattr(tf.utils.import_utils, "is_kernels_available", None)
        if probe is not None:
            probe()
    finally:
        sys.path[:] = saved


def _image(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------ torchvision

# Builders that warn unless told how to initialise weights=None models.
_TV_KWARGS = {"googlenet": {"init_weights": True}, "inception_v3": {"init_weights": True}}
_TV_SIZE = {"inception_v3": 299}


def torchvision_classifiers() -> dict[str, TorchvisionSpec]:
    """Every classification model of torchvision.models: name -> (factory, input shape).

    Inputs are batch 1, 3 channels, 224x224 (299x299 for inception_v3).
    """
    tv = import_torchvision()
    names = tv.models.list_models(module=tv.models)

    def factory(name: str) -> Callable[[], torch.nn.Module]:
        def build() -> torch.nn.Module:
            torch.manual_seed(0)
            return tv.models.get_model(name, weights=None, **_TV_KWARGS.get(name, {})).eval()
        return build

    return {name: TorchvisionSpec(factory(name), (1, 3, _TV_SIZE.get(name, 224),
                                                  _TV_SIZE.get(name, 224)))
            for name in sorted(names)}


# ------------------------------------------------------------------------------ timm

# A spread of timm's families at small sizes (0.2-14 GFLOPs): ResNets and their split-
# attention, selective-kernel, multi-scale and cross-stage-partial kinds (LeakyReLU in
# cspdarknet53), normaliser-free nets with scaled weight-standardised convs and ECA's conv1d
# over channels, dense and re-parameterisable nets, mobile nets, and the transformer, MLP
# and pooling mixers (windowed, haloed, cross-covariance, class, gated positional, linear,
# rotary, spatial-reduction and convolutional attention; focal modulation)
TIMM_NAMES = ("resnet50", "efficientnet_b0", "mobilenetv3_large_100", "convnext_tiny",
              "deit_tiny_patch16_224", "ghostnet_100", "mixnet_s", "levit_128", "regnety_016",
              "vit_tiny_patch16_224",
              "cspresnet50", "cspdarknet53", "cs3darknet_s",
              "eca_resnet33ts", "nf_regnet_b0", "eca_nfnet_l0", "dm_nfnet_f0",
              "resnest14d", "skresnet18", "res2net50_26w_4s", "densenet121", "repvgg_a0",
              "lcnet_100", "rexnet_100", "convnext_atto", "hrnet_w18_small",
              "swin_tiny_patch4_window7_224", "xcit_nano_12_p16_224", "pvt_v2_b0",
              "tiny_vit_5m_224", "efficientformer_l1", "mixer_s16_224", "resmlp_12_224",
              "poolformer_s12", "edgenext_xx_small", "mobilevit_xxs", "fastvit_t8",
              "cait_xxs24_224", "convit_tiny", "efficientvit_b0", "efficientvit_m0",
              "halonet26t", "eva02_tiny_patch14_224", "gmlp_ti16_224", "maxvit_nano_rw_256",
              "coatnet_nano_rw_224", "focalnet_tiny_srf", "repvit_m1", "ghostnetv2_100",
              "crossvit_tiny_240")


BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)


def exercised(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """`model` with every parameter whose elements all equal one constant c (zero or one
    initialised norms and gains, 1e-6 layer scales, zero heads) moved to c + N(0, s^2),
    s = 0.1 max(|c|, 1), and batch norms' running statistics drawn at random (mean
    N(0, 0.01), variance U(0.5, 1.5)); returned in place.

    timm initialises the last norm of each residual branch to zero (ResNets), NFNets' skip
    gains to zero, layer scales to 1e-5 or 1e-6 (ConvNeXt) and some classifier heads to zero
    (MLP-Mixer, ResMLP: the output is all zeros), so an output compared at timm's own
    initialisation hardly depends on those branches, and a wrong one would pass."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            c = p.flatten()[0] if p.numel() else None
            if c is not None and p.is_floating_point() and bool((p == c).all()):
                p.add_(0.1 * max(abs(c.item()), 1.0) * torch.randn(p.shape, generator=gen))
        for m in model.modules():
            if isinstance(m, BATCH_NORMS) and m.running_var is not None:
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))
    return model


def timm_models() -> dict[str, Factory]:
    """The TIMM_NAMES this timm has: name -> factory() -> (model, (image,)), the image of
    the model's default input size, batch 1; the weights random and `exercised`."""
    timm = _import_optional("timm")

    def factory(name: str) -> Factory:
        def build() -> tuple[torch.nn.Module, Inputs]:
            torch.manual_seed(0)
            model = exercised(timm.create_model(name, pretrained=False).eval())
            size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
            return model, (_image((1, *size)),)
        return build

    return {name: factory(name) for name in TIMM_NAMES if timm.is_model(name)}


# ------------------------------------------------------------------------------ Hugging Face

def _token_ids(vocab_size: int, length: int = 128) -> torch.Tensor:
    return torch.randint(0, vocab_size, (1, length), dtype=torch.int64,
                         generator=torch.Generator().manual_seed(0))


# Decoder LMs at GPT-2-small scale (their default configs are 1-7B parameters): 12 layers,
# hidden 768, 12 query heads sharing 4 key/value heads where the family has grouped-query
# attention, a 32000-token vocabulary. The KV cache is off: capture turns it off anyway.
DECODER = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
               num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
               max_position_embeddings=512, use_cache=False)
DECODERS = {"LlamaForCausalLM": ("LlamaConfig", {}), "Qwen2ForCausalLM": ("Qwen2Config", {}),
            "MistralForCausalLM": ("MistralConfig", {}),
            "GPTNeoXForCausalLM": ("GPTNeoXConfig", {"num_key_value_heads": None}),
            "PhiForCausalLM": ("PhiConfig", {}), "GemmaForCausalLM": ("GemmaConfig",
                                                                   {"head_dim": 64}),
            "Phi3ForCausalLM": ("Phi3Config", {"pad_token_id": 0, "eos_token_id": 0})}


# More text encoders at their default sizes (all under 22 GFLOPs at 128 tokens): position
# ids computed from the token ids (RoBERTa's), bottlenecks (MobileBERT), grouped 1x1
# convolutions (SqueezeBERT), T5's RMS norms and relative position bias
ENCODERS = {"DistilBertModel": "DistilBertConfig", "RobertaModel": "RobertaConfig",
            "ElectraModel": "ElectraConfig", "MobileBertModel": "MobileBertConfig",
            "SqueezeBertModel": "SqueezeBertConfig", "T5EncoderModel": "T5Config"}


# Speech encoders at their default (base) sizes, 12 layers of width 768: a conv1d feature
# extractor over one second of 16 kHz waveform (a group norm after its first conv, or
# Data2VecAudio's layer norms after each), grouped conv1d position embeddings (one under
# weight norm, or Data2VecAudio's five), then a transformer encoder (WavLM's with a gated
# relative position bias)
SPEECH = {"Wav2Vec2Model": "Wav2Vec2Config", "HubertModel": "HubertConfig",
          "Data2VecAudioModel": "Data2VecAudioConfig", "WavLMModel": "WavLMConfig"}
WAVEFORM_SAMPLES = 16000


def _whisper_encoder(tf: types.ModuleType) -> tuple[torch.nn.Module, Inputs]:
    """Whisper's encoder (default config: 4 layers, width 384) on 80 log-mel bins by its
    3000 frames (30 s), the length its position table fixes."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    config = tf.WhisperConfig()
    frames = 2 * config.max_source_positions
    return WhisperEncoder(config).eval(), (_image((1, config.num_mel_bins, frames)),)


def hf_models() -> dict[str, Factory]:
    """BertModel, GPT2Model, ViTModel and the ENCODERS with their default configs
    (BERT-base: 12 layers; GPT-2 small; ViT-B/16), the DECODERS families at DECODER's
    size, the SPEECH encoders and WhisperEncoder: name -> factory() -> (model, inputs).
    Text models take token ids int64 (1, 128); ViT takes pixel_values (1, 3, 224, 224);
    the SPEECH encoders a waveform (1, 16000)."""
    tf = _import_optional("transformers")

    def text(model_cls: str, config_cls: str, **options) -> Factory:
        def build() -> tuple[torch.nn.Module, Inputs]:
            torch.manual_seed(0)
            config = getattr(tf, config_cls)(**options)
            return getattr(tf, model_cls)(config).eval(), (_token_ids(config.vocab_size),)
        return build

    def vit() -> tuple[torch.nn.Module, Inputs]:
        torch.manual_seed(0)
        config = tf.ViTConfig()
        shape = (1, config.num_channels, config.image_size, config.image_size)
        return tf.ViTModel(config).eval(), (_image(shape),)

    def speech(model_cls: str, config_cls: str) -> Factory:
        def build() -> tuple[torch.nn.Module, Inputs]:
            torch.manual_seed(0)
            model = getattr(tf, model_cls)(getattr(tf, config_cls)()).eval()
            return model, (_image((1, WAVEFORM_SAMPLES)),)
        return build

    def decoder(model_cls: str, config_cls: str, extra: dict) -> Factory:
        options = {k: v for k, v in {**DECODER, **extra}.items() if v is not None}
        return text(model_cls, config_cls, **options)

    return {"BertModel": text("BertModel", "BertConfig"),
            **{name: text(name, config) for name, config in ENCODERS.items()
               if hasattr(tf, name)},
            # inference without a KV cache: the cache object is not a tensor output
            "GPT2Model": text("GPT2Model", "GPT2Config", use_cache=False),
            "ViTModel": vit,
            **{name: decoder(name, config, extra) for name, (config, extra) in DECODERS.items()
               if hasattr(tf, name)},
            **{name: speech(name, config) for name, config in SPEECH.items()
               if hasattr(tf, name)},
            "WhisperEncoder": lambda: _whisper_encoder(tf)}


# ------------------------------------------------------------------------------ all of them

def all_models() -> dict[str, Factory]:
    """Every model above, named 'torchvision/NAME', 'timm/NAME' or 'hf/NAME', each factory
    returning (model, inputs). A zoo whose package is not installed is left out."""
    out: dict[str, Factory] = {}
    with contextlib.suppress(ImportError):
        for name, spec in torchvision_classifiers().items():
            out[f"torchvision/{name}"] = _with_image(spec)
    for zoo, make in (("timm", timm_models), ("hf", hf_models)):
        with contextlib.suppress(ImportError):
            out.update({f"{zoo}/{name}": f for name, f in make().items()})
    return out


def _with_image(spec: TorchvisionSpec) -> Factory:
    return lambda: (spec.factory(), (_image(spec.input_shape),))


def gflops(model: torch.nn.Module, inputs: Inputs) -> float:
    """GFLOPs of one forward pass (a multiply-add counts 2), counted by
    torch.utils.flop_counter.FlopCounterMode on one no-grad run at the given inputs.

    The parameters' requires_grad is off for the count (and restored): a view of a parameter
    made under no_grad still requires grad with no grad_fn (CaiT's expanded class token),
    and the counter's module tracker fails on such a module input."""
    from torch.utils.flop_counter import FlopCounterMode

    flags = [(p, p.requires_grad) for p in model.parameters()]
    counter = FlopCounterMode(display=False)
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        with torch.no_grad(), counter:
            model(*inputs)
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
    return counter.get_total_flops() / 1e9


if __name__ == "__main__":
    flops = "--flops" in sys.argv[1:]
    for model_name, make_model in all_models().items():
        if flops:
            net, example = make_model()
            print(f"{model_name:40s} {gflops(net, example):8.2f} GFLOPs")
        else:
            print(model_name)
