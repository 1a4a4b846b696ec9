"""Types carried between versions of the working model (passes/_graph.py VersionTypes): every
type a pass is given for a name that lived since an earlier inference equals what a full shape
inference of the version it asks about gives, on the benchmark suite's models and decoders, and
the rewritten model is the one made with every changed version inferred anew."""
import onnx
import pytest

from benchmarks import decoders, models
from optimized.passes import _graph, optimize

# the suite's models whose builders need no torch (the torch-style ones are exported by it),
# and the decoders' other architectures
SUITE = [n for n in models.NAMES if n not in models.TORCH_STYLE] + ["phi3", "llama_4bit"]
# no pass asks these models' types: chain100 has no pattern that needs them, and the light
# models' convolutions take their type from their weights and their Reshapes change rank
ASKS_NO_TYPES = {models.CHAIN, "light_inception_v2", "light_squeezenet", "light_vgg19"}


def _model(name):
    if name == "phi3":
        return decoders.build_phi3(decoders.SIZES["tiny"])
    if name == "llama_4bit":
        return decoders.quantized_4bit(decoders.build_llama(decoders.SIZES["tiny"]))
    return models.build(name)[0]


def _unnamed(tp):
    """The type's bytes with the dimension names inference made up left out (each inference
    numbers them from 0, and Shapes tells them apart by the inference they came from)."""
    if tp is None:
        return None
    tp = onnx.TypeProto.FromString(tp.SerializeToString())
    if tp.WhichOneof("value") == "tensor_type":
        for d in tp.tensor_type.shape.dim:
            if d.dim_param.startswith(_graph.GENERATED_SYMBOL):
                d.dim_param = "made up"
    return tp.SerializeToString()


def _answers(monkeypatch):
    """Every (version bytes, data_prop, name, type bytes or None) a pass was given from
    VersionTypes while optimize ran."""
    asked = []
    real = _graph.VersionTypes.typed

    def typed(self, name):
        tp, source = real(self, name)
        asked.append((self._serialized, self._data_prop, name, _unnamed(tp)))
        return tp, source

    monkeypatch.setattr(_graph.VersionTypes, "typed", typed)
    return asked


@pytest.mark.parametrize("name", SUITE)
def test_carried_types_are_those_full_inference_gives(monkeypatch, name):
    model = _model(name)
    asked = _answers(monkeypatch)
    optimize(model, 99)
    assert asked or name in ASKS_NO_TYPES
    fresh = {}
    for serialized, data_prop, asked_name, answer in asked:
        if (serialized, data_prop) not in fresh:
            version = onnx.ModelProto.FromString(serialized)
            fresh[serialized, data_prop] = _graph._inferred_types(version, data_prop)
        tp = fresh[serialized, data_prop].get(asked_name)
        assert answer == _unnamed(tp), asked_name


@pytest.mark.parametrize("name", ["llama_decode", "phi3", "llama_4bit", "bert_layer",
                                  "light_shufflenet"])
def test_the_rewritten_model_is_the_one_inferring_every_version(monkeypatch, name):
    model = _model(name)
    carried = optimize(model, 99).SerializeToString()
    monkeypatch.setattr(_graph, "CARRY_TYPES", False)
    assert optimize(model, 99).SerializeToString() == carried
