"""Casts and integer computations on the inputs (frontend/integers.py): casts that keep
every value are the value itself, comparisons, cumsum, gather, argmax and indexing by
computed ids are glue of ours; each model is captured with no island and compiled,
untuned, against PyTorch on new token ids."""
import pytest
import torch
import torch.nn as nn

import raytune_kernels as rk
from raytune_kernels.compile.api import compile_network
from raytune_kernels.frontend.integers import exact_cast

PAD = 1


class PositionIds(nn.Module):
    """RoBERTa's embeddings: position ids counted over the tokens that are not padding,
    a token type looked up from an int64 buffer by those ids, all from the token ids."""

    def __init__(self):
        super().__init__()
        self.words, self.positions = nn.Embedding(32, 16), nn.Embedding(40, 16)
        self.types = nn.Embedding(2, 16)
        self.register_buffer("type_ids", torch.zeros(1, 40, dtype=torch.long))
        self.fc = nn.Linear(16, 16)

    def forward(self, ids):
        mask = ids.ne(PAD).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask
        positions = positions.long() + PAD
        types = torch.gather(self.type_ids.expand(ids.shape[0], -1), 1, positions)
        x = self.words(ids) + self.positions(positions) + self.types(types)
        return self.fc(x.to(torch.float32).type_as(x))


class PooledToken(nn.Module):
    """CLIP's text pooling: the hidden state at the largest token id of each row."""

    def __init__(self):
        super().__init__()
        self.words, self.fc = nn.Embedding(32, 16), nn.Linear(16, 8)

    def forward(self, ids):
        hidden = self.words(ids)
        rows = torch.arange(hidden.shape[0])
        return self.fc(hidden[rows, ids.to(dtype=torch.int).argmax(dim=-1)])


def _ids(seed: int) -> torch.Tensor:
    ids = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(seed))
    ids[:, -3:] = PAD  # padded rows: their positions stay at the padding index
    return ids


@pytest.mark.parametrize("model", [PositionIds, PooledToken])
def test_integer_glue_captures_with_no_island_and_compiles(model):
    torch.manual_seed(0)
    net_model = model().eval()
    graph = rk.capture(net_model, (_ids(0),), strict=True)
    ops = {n.op for n in graph.nodes}
    assert "torch" not in ops
    assert ({"compare", "cumsum", "gather"} if model is PositionIds else {"argmax"}) <= ops
    net = compile_network(net_model, (_ids(0),), None, threads=1)
    new = _ids(1)
    with torch.no_grad():
        assert torch.allclose(net(new), net_model(new), atol=1e-5, rtol=1e-5)


def test_casts_that_keep_every_value_are_no_ops_and_the_others_are_refused():
    assert exact_cast(torch.float32, torch.float32) and exact_cast(torch.int64, torch.int32)
    assert exact_cast(torch.bool, torch.int64) and exact_cast(torch.int32, torch.float32)
    assert not exact_cast(torch.float32, torch.int64)  # truncates
    assert not exact_cast(torch.float32, torch.float64) and not exact_cast(torch.int64, torch.bool)

    class Truncated(nn.Module):
        def forward(self, x):
            return x.long().float() * 2

    with pytest.raises(rk.UnsupportedOpError, match="a cast from torch.float32 to torch.int64"):
        rk.capture(Truncated(), (torch.randn(2, 4),), strict=True)
