"""Before IR version 4 every initializer had to be listed as a graph input too, so such a listing
says nothing about the user wanting to override it. Dropping those inputs (and moving to IR 4)
lets the other passes treat the weights as the constants they are. From IR 4 on, an initializer
that is also an input is a deliberate, overridable default and stays as it is."""
from __future__ import annotations

import onnx

from ._graph import copy_model, initializer_names


def freeze_initializer_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    if model.ir_version >= 4:
        return model
    names = initializer_names(model.graph)
    if not any(i.name in names for i in model.graph.input):
        return model
    model = copy_model(model)
    kept = [i for i in model.graph.input if i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.ir_version = 4
    return model
