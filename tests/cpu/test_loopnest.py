import numpy as np

from raytune_kernels.cpu.loopnest import (PARALLEL, SERIAL, Access, Affine, Buffer, EpiStep,
                                          UpdateTile, For, LoopNest, Split, StoreTile, Tile,
                                          ZeroTile, interpret)


def matmul_nest(m=4, k=6, n=16, lanes=8):
    """out[m, n] = relu(a[m, k] @ b[k, n] + bias[n]), a 2x1 tile of 2 vectors."""
    tile = Tile("t", (2, 1), n // lanes)
    body = (For("p", m // 2, PARALLEL, (
        Split("p", ("mi",), (m // 2,)),
        ZeroTile("t"),
        For("kk", k, SERIAL, (UpdateTile("t", Access("a", Affine((("mi", 2 * k), ("kk", 1)))),
                                      (k, 0), Access("b", Affine((("kk", n),)))),)),
        StoreTile("t", Access("out", Affine((("mi", 2 * n),))), (n, 0),
                  (EpiStep("add", ((Access("bias", Affine()), (0, 0)),)), EpiStep("relu"))),
    )),)
    bufs = (Buffer("a", m * k, "in"), Buffer("b", k * n, "in"), Buffer("bias", n, "in"),
            Buffer("out", m * n, "out"))
    return LoopNest("mm", bufs, (tile,), body, lanes)


def test_interpreter_is_the_executable_definition():
    rng = np.random.default_rng(0)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((4, 6), (6, 16), (16,)))
    bufs = {"a": a.ravel(), "b": b.ravel(), "bias": bias, "out": np.zeros(64, np.float32)}
    interpret(matmul_nest(), bufs)
    np.testing.assert_allclose(bufs["out"].reshape(4, 16), np.maximum(a @ b + bias, 0),
                               rtol=1e-5, atol=1e-5)


def test_split_decomposes_most_significant_first():
    env = {"p": 7}
    from raytune_kernels.cpu.loopnest import _split
    _split(Split("p", ("x", "y"), (3, 4)), env)
    assert (env["x"], env["y"]) == (1, 3)


def test_tile_offsets_are_row_major():
    assert Tile("t", (2, 3), 1).offsets((100, 1)) == [0, 1, 2, 100, 101, 102]


def test_affine_eval():
    assert Affine((("i", 3), ("j", 5)), 2).eval({"i": 1, "j": 2}) == 15


def test_expression_nodes_hash_once_and_pickle_without_their_hash():
    import pickle

    from raytune_kernels.cpu.loopnest import Bin, Ld, Num, Un, loaded_buffers

    shared = Bin("add", Ld(Access("x", Affine())), Ld(Access("y", Affine())))
    e = Un("relu", Bin("mul", shared, Bin("sub", shared, Num(2.0))))
    same = Un("relu", Bin("mul", shared, Bin("sub", shared, Num(2.0))))
    assert e == same and hash(e) == hash(same) and "_hash" in e.__dict__
    back = pickle.loads(pickle.dumps(e))
    assert back == e and "_hash" not in back.__dict__ and hash(back) == hash(e)
    assert loaded_buffers(e) == {"x", "y"}
    assert {e: 1}[back] == 1
