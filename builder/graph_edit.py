"""Small tools for rewriting an ONNX graph in place: appending named nodes, finding producers and
consumers, pruning what no output needs, and sorting nodes topologically."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"


class NodeWriter:
    """Appends constants and nodes to a graph, each under a unique name with `prefix`."""

    def __init__(self, graph: onnx.GraphProto, prefix: str) -> None:
        self.graph, self.prefix, self.count = graph, prefix, 0

    def const(self, name: str, value: Any, dtype: Any = None) -> str:
        """An initializer holding `value` (a numpy array or scalar); returns its name."""
        self.count += 1
        full = f"{self.prefix}{name}_{self.count}"
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), full))
        return full

    def op(self, op_type: str, inputs: list[str], outputs: list[str] | None = None, domain: str = "",
           **attributes: Any) -> str:
        """Append one node; returns its (first) output name, `outputs[0]` when given."""
        self.count += 1
        name = f"{self.prefix}{op_type}_{self.count}"
        names = outputs or [f"{name}_out"]
        self.graph.node.append(helper.make_node(op_type, inputs, names, name=name, domain=domain, **attributes))
        return names[0]


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """Tensor name -> the node that computes it."""
    return {out: node for node in graph.node for out in node.output if out}


def consumers(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    """The nodes that read tensor `name`."""
    return [node for node in graph.node if name in node.input]


def the_node(graph: onnx.GraphProto, op_type: str) -> onnx.NodeProto:
    """The one node of `op_type`; ValueError when there are none or several."""
    nodes = [n for n in graph.node if n.op_type == op_type]
    if len(nodes) != 1:
        raise ValueError(f"expected one {op_type} node, found {len(nodes)}")
    return nodes[0]


def constant_value(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    """The value of `name` when it is an initializer or a Constant node's output, else None."""
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name and node.attribute:
            value = helper.get_attribute_value(node.attribute[0])
            return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)
    return None


def attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def ensure_opset(model: onnx.ModelProto, domain: str = MS_DOMAIN, version: int = 1) -> None:
    """Import `domain` (onnxruntime's contrib ops need com.microsoft declared before shape inference)."""
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, version))


def topological_sort(graph: onnx.GraphProto, strict: bool = True) -> None:
    """Order nodes so that each comes after the producers of its inputs. Not `strict`: nodes that read
    tensors nothing defines any more are kept at the end (pruning drops them)."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:
            if not strict:
                ordered.extend(pending)
                break
            missing = sorted({i for n in pending for i in n.input if i not in available})
            raise ValueError(f"graph has a cycle or undefined inputs: {missing[:5]}")
        ready_ids = {id(n) for n in ready}
        for node in ready:
            ordered.append(node)
            available.update(node.output)
        pending = [n for n in pending if id(n) not in ready_ids]
    del graph.node[:]
    graph.node.extend(ordered)


def prune(graph: onnx.GraphProto, outputs: list[str]) -> None:
    """Keep only the graph outputs `outputs`, the nodes they need and the initializers those read."""
    topological_sort(graph, strict=False)
    needed, keep = set(outputs), []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    used = {i for n in graph.node for i in n.input} | set(outputs)
    initializers = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    kept = [o for o in graph.output if o.name in outputs]
    del graph.output[:]
    graph.output.extend(kept)
