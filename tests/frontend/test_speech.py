"""Hugging Face speech encoders, small configs with random weights (2 layers, hidden 64, a
three-conv feature extractor): each is captured with no PyTorch island (conv1d feature
extractors with a group norm or per-layer layer norms, the grouped conv1d position
embedding under weight norm, WavLM's gated relative position bias, Whisper's two convs
over log-mel bins), compiled untuned at 1 thread and compared with the model on a new
input. Skipped without transformers."""
import pytest
import torch

from raytune_kernels.compile.api import compile_network
from raytune_kernels.compile.report import output_error
from tests.support.hf import hf_model, transformers_or_skip

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
# name: (model class, config class, config options)
ENCODERS = {
    "wav2vec2": ("Wav2Vec2Model", "Wav2Vec2Config", SMALL),
    "wav2vec2_layer_norm": ("Wav2Vec2Model", "Wav2Vec2Config",
                            dict(SMALL, feat_extract_norm="layer", do_stable_layer_norm=True)),
    "data2vec_audio": ("Data2VecAudioModel", "Data2VecAudioConfig",
                       dict(SMALL, num_conv_pos_embeddings=5)),
    "wavlm": ("WavLMModel", "WavLMConfig", dict(SMALL, num_buckets=32,
                                                max_bucket_distance=64)),
}
# the same feature extractor and encoder as Wav2Vec2's, checked in the slow run
MORE_ENCODERS = {"hubert": ("HubertModel", "HubertConfig", SMALL)}
SAMPLES = 1600


def _wave(seed: int, shape=(1, SAMPLES)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _error(model: torch.nn.Module, example, new) -> float:
    net = compile_network(model, (example,), None, target="llvm", threads=1)
    islands = [n.attr("what") for n in net.part.graph.nodes if n.op == "torch"]
    assert islands == [], islands
    with torch.no_grad():
        return output_error(net(new), model(new))


@pytest.mark.parametrize("name", ENCODERS)
def test_speech_encoder_captures_with_no_island_and_compiles(name):
    _check_encoder(ENCODERS[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", MORE_ENCODERS)
def test_more_speech_encoders_capture_with_no_island_and_compile(name):
    _check_encoder(MORE_ENCODERS[name])


def _check_encoder(family: tuple) -> None:
    assert _error(hf_model(family), _wave(0), _wave(1)) < 1e-5


def test_whisper_encoder_captures_with_no_island_and_compiles():
    tf = transformers_or_skip()
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    config = tf.WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                              encoder_ffn_dim=128, num_mel_bins=16, max_source_positions=50)
    model = WhisperEncoder(config).eval()
    shape = (1, config.num_mel_bins, 2 * config.max_source_positions)
    assert _error(model, _wave(0, shape), _wave(1, shape)) < 1e-5
