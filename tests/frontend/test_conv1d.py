"""1-D convolutions as 2-D ones of height 1 (frontend/conv1d.py): the elementwise ops after
them fuse into the conv (the reshape to 3-D moves past them), a batch norm folds into it;
captured with no island, compiled untuned and checked against PyTorch; Hugging Face speech
encoders (conv1d feature extractors) capture with no island. Batch 1: the CPU kernels
lower convolutions of batch 1."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import raytune_kernels as rk
from raytune_kernels.compile.api import compile_network
from raytune_kernels.compile.report import output_error
from raytune_kernels.frontend.partition import execute, partition
from tests.support.hf import transformers_or_skip


class Signal(nn.Module):
    """A feature extractor's convs (strided, batch norm, GELU; grouped and dilated with a
    LeakyReLU and a residual) and ECA channel attention (a conv1d across channels)."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn = nn.Conv1d(4, 16, 5, stride=2, padding=2), nn.BatchNorm1d(16)
        self.c2 = nn.Conv1d(16, 16, 3, padding="same", dilation=2, groups=2, bias=False)
        self.eca = nn.Conv1d(1, 1, 3, padding=1, bias=False)

    def forward(self, x):
        y = F.gelu(self.bn(self.c1(x)))
        y = F.leaky_relu(self.c2(y), 0.1) + y
        a = self.eca(y.mean(-1, keepdim=True).transpose(-1, -2)).transpose(-1, -2)
        return y * torch.sigmoid(a)


def test_conv1d_is_a_conv2d_of_height_one_with_its_epilogue_fused():
    torch.manual_seed(0)
    model = Signal().eval()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 4, 32)
    graph = rk.capture(model, (x,), strict=True)  # no island
    convs = [t.compute for t in partition(graph).tasks if t.compute.op == "conv2d"]
    assert [c.describe() for c in convs[:2]] == [
        "conv2d 1x4x1x32 -> 16ch k1x5 s1x2 +bias+gelu",  # the batch norm folded in
        "conv2d 1x16x1x16 -> 16ch k1x3 s1 g2 d1x2 +prelu+add"]
    with torch.no_grad():
        assert torch.allclose(execute(partition(graph), [x])[0], model(x), atol=1e-5)
    net = compile_network(model, (x,), None, threads=1)
    y = torch.randn(1, 4, 32)
    with torch.no_grad():
        assert torch.allclose(net(y), model(y), atol=1e-5, rtol=1e-5)


def test_functional_conv1d_through_export_is_lowered_too():
    class Exported(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 3, 3))

        def forward(self, x):
            if x.shape[-1] > 4:  # control flow on a shape: export, aten.conv1d
                x = F.conv1d(x, self.w, padding="same", dilation=2)
            return torch.relu(x)

    model, x = Exported(), torch.randn(1, 3, 20)
    graph = rk.capture(model, (x,), strict=True)
    assert [n.op for n in graph.nodes if n.op == "conv2d"] == ["conv2d"]
    with torch.no_grad():
        assert torch.allclose(execute(partition(graph), [x])[0], model(x), atol=1e-5)


SPEECH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
              conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
              num_conv_pos_embedding_groups=4)


@pytest.mark.parametrize("name", [pytest.param("Hubert", marks=pytest.mark.e2e)]
                         + [pytest.param(n, marks=pytest.mark.slow)
                                               for n in ("Wav2Vec2", "WavLM", "Whisper")])
def test_speech_encoders_capture_with_no_island_and_compile(name):
    tf = transformers_or_skip()
    torch.manual_seed(0)
    if name == "Whisper":
        config = tf.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4,
                                  encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                                  max_source_positions=32, vocab_size=128, pad_token_id=0,
                                  bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)
        model, shape = tf.WhisperModel(config).get_encoder(), (1, 16, 64)
    else:
        config = getattr(tf, f"{name}Config")(**SPEECH)
        model, shape = getattr(tf, f"{name}Model")(config), (1, 1600)
    model.eval()
    x = torch.randn(shape)
    net = compile_network(model, (x,), None, threads=1)
    assert [n for n in net.part.graph.nodes if n.op == "torch"] == []
    y = torch.randn(shape)
    with torch.no_grad():
        assert output_error(net(y), model(y)) < 1e-5
