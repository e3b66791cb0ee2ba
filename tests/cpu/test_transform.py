import itertools

import numpy as np
import pytest
import torch

from raytune_kernels.cpu.build import LoadedKernel, build
from raytune_kernels.cpu.build import aligned
from raytune_kernels.cpu.llvm.ir import render
from raytune_kernels.cpu.loopnest import interpret
from raytune_kernels.cpu.transform import Layout, transform_nest, transform_space

LAYOUTS = ["NCHW", "NHWC", "NCHW8c", "NCHW16c", "NCHW32c"]


@pytest.mark.parametrize("src, dst", [p for p in itertools.permutations(LAYOUTS, 2)])
def test_every_transform_compiles_and_moves_data(src, dst):
    shape = (1, 64, 5, 9)
    x = torch.randn(shape)
    for cfg in list(transform_space(shape, src, dst))[::5]:
        nest = transform_nest(shape, src, dst, cfg)
        result = build(render(nest))
        assert result.error is None, result.error
        inp, out = aligned(Layout(src).pack(x)), aligned(np.zeros(x.numel(), np.float32))
        LoadedKernel(result.library, nest.name, 2)([inp.ctypes.data, out.ctypes.data], 2)
        assert torch.equal(Layout(dst).unpack(out, shape), x), (src, dst, cfg)


def test_transform_interprets_the_same():
    shape = (1, 32, 3, 7)
    x = torch.randn(shape)
    cfg = next(iter(transform_space(shape, "NCHW", "NCHW16c")))
    bufs = {"src": Layout("NCHW").pack(x), "dst": np.zeros(x.numel(), np.float32)}
    interpret(transform_nest(shape, "NCHW", "NCHW16c", cfg), bufs)
    assert torch.equal(Layout("NCHW16c").unpack(bufs["dst"], shape), x)


def test_bad_layouts_are_named():
    cfg = next(iter(transform_space((1, 24, 4, 4), "NCHW", "NHWC")))
    with pytest.raises(ValueError, match="divisible by 16"):
        transform_nest((1, 24, 4, 4), "NCHW", "NCHW16c", cfg)
    with pytest.raises(ValueError, match="unknown layout 'NWHC'"):
        transform_nest((1, 24, 4, 4), "NCHW", "NWHC", cfg)


def test_pad_and_pack_produces_the_conv_kernels_input():
    """NCHW -> padded NCHW16c by our own kernel equals what the conv kernel reads."""
    import raytune_kernels as rk
    from raytune_kernels.cpu.contraction import Conv2dContraction
    from raytune_kernels.space import Config
    model = torch.nn.Conv2d(32, 16, 3, padding=1)
    task = rk.extract_tasks(model.eval(), (torch.randn(1, 32, 7, 9),))[0]
    con = Conv2dContraction.from_compute(task.compute)
    x = torch.randn(1, 32, 7, 9)
    expected = con.pack_a(x, Config.of(cb=16))
    dst = Layout("NCHW16c", pad=(1, 1))
    for cfg in transform_space(x.shape, "NCHW", "NCHW16c"):
        nest = transform_nest(tuple(x.shape), Layout("NCHW"), dst, cfg)
        result = build(render(nest))
        assert result.error is None, result.error
        inp = aligned(Layout("NCHW").pack(x))
        out = aligned(np.full(dst.size(tuple(x.shape)), 0.0, np.float32))  # border set once
        LoadedKernel(result.library, nest.name, 2)([inp.ctypes.data, out.ctypes.data], 2)
        assert np.array_equal(out, expected)
        assert torch.equal(dst.unpack(out, tuple(x.shape)), x)


PERMUTES = [((1, 128, 12, 64), (0, 2, 1, 3)),  # attention heads: the last axis stays last
            ((1, 12, 32, 64), (0, 1, 3, 2)),  # keys transposed: a tile of scalars
            ((2, 3, 5, 7), (3, 1, 0, 2)), ((37, 19), (1, 0)), ((4, 6, 24), (1, 0, 2)),
            ((5,), (0,)), ((3, 16, 10), (2, 0, 1))]


@pytest.mark.parametrize("shape, dims", PERMUTES)
@pytest.mark.parametrize("lanes", [16, 8])
def test_permute_copies_match_torch_at_any_thread_count(shape, dims, lanes):
    """x.permute(dims).contiguous(), bit for bit, from the permuted view's strides: whether
    its last axis stays last (vector runs, where the lanes divide it) or not, at 1 and 3
    threads (an uneven share), and on the interpreter."""
    from raytune_kernels.cpu.transform import strided_nest

    x = torch.randn(shape)
    v = x.permute(dims)
    nest = strided_nest(x.numel(), tuple(v.shape), tuple(v.stride()), 0, lanes)
    result = build(render(nest))
    assert result.error is None, result.error
    kernel = LoadedKernel(result.library, nest.name, 2)
    src, want = aligned(x.numpy().ravel().copy()), v.contiguous().numpy().ravel()
    for threads in (1, 3):
        out = aligned(np.full(x.numel(), np.nan, np.float32))
        kernel([src.ctypes.data, out.ctypes.data], threads)
        assert np.array_equal(out, want), (shape, dims, lanes, threads)
    bufs = {"src": x.numpy().ravel().copy(), "dst": np.zeros(x.numel(), np.float32)}
    interpret(nest, bufs)
    assert np.array_equal(bufs["dst"], want)


def test_a_strided_copy_of_nothing_is_named():
    from raytune_kernels.cpu.transform import strided_nest

    with pytest.raises(ValueError, match=r"shape \(2, 0\) and strides \(1, 2\)"):
        strided_nest(4, (2, 0), (1, 2), 0, 8)


CONCATS = [([(1, 64, 7, 7), (1, 32, 7, 7)], 1),  # DenseNet's: 16-lane runs
           ([(1, 3, 5), (1, 3, 2), (1, 3, 7)], 2),  # runs no vector divides: scalars
           ([(2, 3, 4), (5, 3, 4)], 0), ([(4, 6), (4, 10)], 1),
           ([(1, 12, 8, 64), (1, 12, 8, 64)], 3)]


@pytest.mark.parametrize("shapes, dim", CONCATS)
@pytest.mark.parametrize("lanes", [16, 8])
def test_concat_copies_match_torch_at_any_thread_count(shapes, dim, lanes):
    from raytune_kernels.cpu.transform import concat_nest

    nest = concat_nest(shapes, dim, lanes)
    result = build(render(nest))
    assert result.error is None, result.error
    kernel = LoadedKernel(result.library, nest.name, len(shapes) + 1)
    xs = [torch.randn(s) for s in shapes]
    want = torch.cat(xs, dim).numpy().ravel()
    srcs = [aligned(x.numpy().ravel().copy()) for x in xs]
    for threads in (1, 3):
        out = aligned(np.full(want.size, np.nan, np.float32))
        kernel([s.ctypes.data for s in srcs] + [out.ctypes.data], threads)
        assert np.array_equal(out, want), (shapes, dim, lanes, threads)
    bufs = {f"src{k}": x.numpy().ravel().copy() for k, x in enumerate(xs)}
    bufs["dst"] = np.zeros(want.size, np.float32)
    interpret(nest, bufs)
    assert np.array_equal(bufs["dst"], want)


def test_a_concat_of_unlike_shapes_is_named():
    from raytune_kernels.cpu.transform import concat_nest

    with pytest.raises(ValueError, match="differ only on axis 1"):
        concat_nest([(1, 4, 5), (1, 4, 6)], 1, 8)


@pytest.mark.parametrize("view", [lambda x: x[:, 1:4, ::2], lambda x: x[1, :, 3],
                                  lambda x: x[None, :, 2:3].expand(3, 2, 1, 8, 6),
                                  lambda x: x.transpose(0, 2)[1:, :, 1]])
@pytest.mark.parametrize("lanes", [16, 8])
def test_a_views_copy_matches_torch(view, lanes):
    """Slices with steps, a select, an expand (stride 0) and a transposed slice, from their
    shape, strides and offset, at 1 and 3 threads."""
    from raytune_kernels.cpu.transform import strided_nest

    x = torch.randn(2, 5, 8, 6)
    v = view(x)
    nest = strided_nest(x.numel(), tuple(v.shape), tuple(v.stride()), v.storage_offset(), lanes)
    result = build(render(nest))
    assert result.error is None, result.error
    kernel = LoadedKernel(result.library, nest.name, 2)
    src, want = aligned(x.numpy().ravel().copy()), v.contiguous().numpy().ravel()
    for threads in (1, 3):
        out = aligned(np.full(want.size, np.nan, np.float32))
        kernel([src.ctypes.data, out.ctypes.data], threads)
        assert np.array_equal(out, want), (tuple(v.shape), lanes, threads)


@pytest.mark.parametrize("src, dst", [("NHWC", "NCHW32c"), ("NCHW16c", "NHWC"),
                                      ("NCHW", "NCHW8c")])
def test_a_copy_splitting_rows_first_moves_the_same_data(src, dst):
    """rows_first changes which thread copies what (bands of rows, as a producer that
    split rows wrote them), not what lands where: natively at 1-3 threads, interpreted."""
    shape = (1, 64, 9, 6)
    x = torch.randn(shape)
    cfg = next(c for c in transform_space(shape, src, dst) if c["parallel"])
    rows = type(cfg)(tuple(sorted(cfg.knobs + (("rows_first", True),))))
    nest = transform_nest(shape, src, dst, rows)
    assert render(nest) != render(transform_nest(shape, src, dst, cfg))
    result = build(render(nest))
    assert result.error is None, result.error
    for threads in (1, 2, 3):
        inp, out = aligned(Layout(src).pack(x)), aligned(np.zeros(x.numel(), np.float32))
        LoadedKernel(result.library, nest.name, 2)([inp.ctypes.data, out.ctypes.data], threads)
        assert torch.equal(Layout(dst).unpack(out, shape), x), threads
    bufs = {"src": Layout(src).pack(x), "dst": np.zeros(x.numel(), np.float32)}
    interpret(nest, bufs)
    assert torch.equal(Layout(dst).unpack(bufs["dst"], shape), x)
