"""Hugging Face decoder language models, small configs with random weights (2 layers,
hidden 64, vocabulary 128, 16 token ids): each is captured with no PyTorch island (its
KV cache turned off, rotary embeddings, grouped-query attention, RMSNorm, gated MLPs,
the causal mask folded at capture), compiled untuned at 1 thread, and compared with the
model on new token ids. Skipped without transformers."""
import pytest
import torch

from raytune_kernels.compile.api import compile_network
from raytune_kernels.compile.report import output_error
from tests.support.hf import hf_model

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
NEOX = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            vocab_size=128, max_position_embeddings=64)
# family: (model class, config class, config options)
FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", SMALL),
    "llama_base": ("LlamaModel", "LlamaConfig", SMALL),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", SMALL),
    "mistral": ("MistralForCausalLM", "MistralConfig", SMALL),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", NEOX),
    "phi": ("PhiForCausalLM", "PhiConfig", SMALL),
}
MORE_FAMILIES = {
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(SMALL, head_dim=16)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(SMALL, head_dim=16)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(SMALL, head_dim=16)),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(SMALL, pad_token_id=0)),
    "stablelm": ("StableLmForCausalLM", "StableLmConfig", SMALL),
    "olmo": ("OlmoForCausalLM", "OlmoConfig", dict(SMALL, pad_token_id=0)),
    "falcon": ("FalconForCausalLM", "FalconConfig", dict(hidden_size=64, num_hidden_layers=2,
                                                         num_attention_heads=4, vocab_size=128)),
    "gptj": ("GPTJForCausalLM", "GPTJConfig", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128,
                                                   n_positions=64, rotary_dim=8, bos_token_id=0,
                                                   eos_token_id=0)),
}


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(seed))


def _compiles_with_no_island(family: tuple) -> float:
    model = hf_model(family)
    net = compile_network(model, (_ids(0),), None, target="llvm", threads=1)
    islands = [n.attr("what") for n in net.part.graph.nodes if n.op == "torch"]
    assert islands == [], islands
    assert not model.config.use_cache  # the cache is no output of the graph
    with torch.no_grad():
        return output_error(net(_ids(1)), model(_ids(1)))


@pytest.mark.parametrize("name", FAMILIES)
def test_decoder_lm_captures_with_no_island_and_compiles(name):
    assert _compiles_with_no_island(FAMILIES[name]) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", MORE_FAMILIES)
def test_more_decoder_families_capture_with_no_island_and_compile(name):
    assert _compiles_with_no_island(MORE_FAMILIES[name]) < 1e-4  # Gemma2: tanh soft-capping


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gptj"])
def test_a_decoder_lm_runs_on_the_emulated_gpu(name):
    """The same capture compiled for CUDA (each task's untuned default config, built by
    NVRTC) and run by the CPU CUDA emulator: rotary tables, grouped-query heads and
    RMSNorm in our CUDA kernels, with no PyTorch step."""
    from raytune_kernels.compile.cuda_network import compile_network_cuda
    from raytune_kernels.cuda.build import nvrtc_unavailable
    from tests.support import cuda_emulate
    from tests.support.gpu_emulator import EmulatorDevice
    if nvrtc_unavailable() is not None or cuda_emulate.compiler() is None:
        pytest.skip("needs NVRTC and a C++ compiler for the CUDA emulator")
    model = hf_model({**FAMILIES, **MORE_FAMILIES}[name])
    with pytest.warns(UserWarning, match="untuned default"):
        net = compile_network_cuda(model, (_ids(0),), [], "cuda -arch=sm_90",
                                   device=EmulatorDevice)
    assert "torch" not in [s.kind for s in net.steps]
    with torch.no_grad():
        assert output_error(net(_ids(1)), model(_ids(1))) < 1e-5
