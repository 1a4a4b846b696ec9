"""conv_bn_folding and conv_affine_folding scale a weight in place (own_weight) only where a
pass of the same optimize() made it and the Conv alone reads it: the results are bit for bit
those of the copying path (optimize without a store), and a weight the caller's store held
before, or one that a second node reads, keeps its values."""
import numpy as np
import onnx
from onnx import helper, numpy_helper

from optimized.passes import _graph, optimize
from reference.weights import WeightStore, attached, is_stub

from .helpers import assert_same_outputs, make_model, op_types

RNG = np.random.default_rng(11)
OUT, IN, KH, KW = 6, 5, 7, 8  # more than SMALL_TENSOR elements: the weight is a stub


def conv_chain(fresh: bool, second_reader: bool = False):
    """Conv -> BatchNormalization -> Mul -> Add per channel; with `fresh`, the weight is made by
    an Add that constant folding evaluates (so a pass makes its array), else an initializer."""
    c = OUT
    inits = {"gamma": RNG.uniform(0.5, 2, c).astype(np.float32),
             "beta": RNG.standard_normal(c).astype(np.float32),
             "mean": RNG.standard_normal(c).astype(np.float32),
             "var": RNG.uniform(0.5, 2, c).astype(np.float32),
             "scale": RNG.uniform(0.5, 2, (1, c, 1, 1)).astype(np.float32),
             "shift": RNG.standard_normal((1, c, 1, 1)).astype(np.float32)}
    w = RNG.standard_normal((OUT, IN, KH, KW)).astype(np.float32)
    nodes = []
    if fresh:
        inits["w0"], inits["dw"] = w, np.float32(0.25)
        nodes.append(helper.make_node("Add", ["w0", "dw"], ["w"]))
    else:
        inits["w"] = w
    nodes += [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 2, 1, 2]),
              helper.make_node("BatchNormalization", ["conv", "gamma", "beta", "mean", "var"],
                               ["bn"], epsilon=1e-3),
              helper.make_node("Mul", ["bn", "scale"], ["scaled"]),
              helper.make_node("Add", ["scaled", "shift"], ["y"])]
    outputs = [("y", [2, OUT, 5, 8])]
    if second_reader:
        nodes.append(helper.make_node("Conv", ["x", "w"], ["z"]))
        outputs.append(("z", [2, OUT, 3, 4]))
    return make_model(nodes, [("x", [2, IN, 9, 11])], outputs, inits)


def initializer_bytes(model):
    return {t.name: numpy_helper.to_array(t).tobytes() for t in attached(model).graph.initializer}


def test_fresh_weight_is_scaled_in_place_bit_for_bit(monkeypatch):
    model = conv_chain(fresh=True)
    owned = []
    real = _graph.own_weight

    def counting(*args):
        owned.append(real(*args))
        return owned[-1]
    for module in ("conv_bn_folding", "conv_affine_folding"):
        monkeypatch.setattr(f"optimized.passes.{module}.own_weight", counting)
    store = WeightStore()
    with_store = optimize(model, 2, store)
    assert sum(a is not None for a in owned) == 2  # both passes wrote into the one array
    assert op_types(with_store)["Conv"] == 1 and "BatchNormalization" not in op_types(with_store)
    assert any(is_stub(t) for t in with_store.graph.initializer)
    assert initializer_bytes(with_store) == initializer_bytes(optimize(model, 2))
    assert_same_outputs(model, attached(with_store))


def test_weight_the_store_held_before_keeps_its_values():
    original = conv_chain(fresh=False)
    model, store = onnx.ModelProto(), WeightStore()
    model.CopyFrom(original)
    (w,) = [t for t in model.graph.initializer if t.name == "w"]
    held = numpy_helper.to_array(w).copy()  # its own memory, as a pass's array would be
    before = held.copy()
    store.stub(w, held)  # the caller's model reads it (the store lets it go once done)
    rewritten = optimize(model, 2, store)
    assert "BatchNormalization" not in op_types(rewritten)
    assert held.tobytes() == before.tobytes()
    assert initializer_bytes(rewritten) == initializer_bytes(optimize(original, 2))


def test_fresh_weight_read_by_a_second_conv_is_copied():
    model = conv_chain(fresh=True, second_reader=True)
    store = WeightStore()
    rewritten = optimize(model, 2, store)
    assert initializer_bytes(rewritten) == initializer_bytes(optimize(model, 2))
    assert_same_outputs(model, attached(rewritten))


def test_scale_channels_in_place_is_the_copying_result():
    from optimized.passes._graph import scale_channels

    BUFFER = np.getbufsize()  # elements numpy's ufuncs cast at a time
    for shape in [(OUT, IN, KH, KW), (3, BUFFER + 5), (2 * BUFFER + 1, 1, 2)]:
        w = (RNG.standard_normal(shape) * 100).astype(np.float32)
        scale = RNG.standard_normal(shape[0]) * 3.7
        copied = scale_channels(w, scale)
        assert scale_channels(w, scale, out=w) is w
        assert w.tobytes() == copied.tobytes()
