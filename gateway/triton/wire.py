"""One inference call on the wire: its tensors, the `ModelInferRequest` built from them, the answer read back.

The request is built straight into tritonclient's protobuf (`tritonclient.grpc.service_pb2`), field for field as
tritonclient's own client builds it from `InferInput`/`InferRequestedOutput` objects, less those objects: one
message per tensor, each copied into the request. With the shm bookkeeping around it, that was a quarter of a
worker's CPU per call to Triton on a lone text (loadtest/results/local-2core-20y-triton-call). A failed call
becomes tritonclient's `InferenceServerException`, as tritonclient's client raises it, so one `translate_error`
reads both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc
import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from contract import TIMEOUT_PARAMETER
from gateway.triton.shm_pool import Region, serialize_texts

# Triton's tensor parameters that place a tensor in a registered region
_SHM_REGION, _SHM_SIZE, _SHM_OFFSET = "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"


@dataclass(frozen=True)
class Tensor:
    """An input of a call: int32 token tensors, or texts (a BYTES [n, 1] tensor)."""

    name: str
    data: np.ndarray | list[bytes]

    @property
    def shape(self) -> list[int]:
        return list(self.data.shape) if isinstance(self.data, np.ndarray) else [len(self.data), 1]

    @property
    def datatype(self) -> str:
        return "INT32" if isinstance(self.data, np.ndarray) else "BYTES"

    def payload(self) -> bytes | np.ndarray:
        """The tensor's bytes as Triton reads them (its BYTES serialization for texts), in a region or in gRPC."""
        return self.data if isinstance(self.data, np.ndarray) else serialize_texts(self.data)


@dataclass(frozen=True)
class Wanted:
    """An output a call asks for, and the shape and dtype it must come back in."""

    name: str
    dtype: type
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def _in_region(parameters: object, region: Region, size: int, offset: int) -> None:
    params = parameters  # a protobuf map of InferParameter
    params[_SHM_REGION].string_param = region.name  # type: ignore[index]
    params[_SHM_SIZE].int64_param = size  # type: ignore[index]
    if offset:
        params[_SHM_OFFSET].int64_param = offset  # type: ignore[index]


def inference_request(model: str, inputs: list[Tensor], outputs: list[Wanted], region: Region | None,
                      timeout_us: int, parameters: dict[str, str] | None = None) -> service_pb2.ModelInferRequest:
    """The call's request: each input written into its slot of `region` when it fits (else sent in the
    request's raw contents), each output asked into its slot (all of them fit: the caller checked), Triton's
    request `timeout` (us) and string `parameters`."""
    request = service_pb2.ModelInferRequest(model_name=model)
    request.parameters[TIMEOUT_PARAMETER].int64_param = timeout_us
    for key, value in (parameters or {}).items():
        request.parameters[key].string_param = value
    for tensor in inputs:
        entry = request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        payload = tensor.payload()
        if region is not None:
            size = payload.nbytes if isinstance(payload, np.ndarray) else len(payload)
            if region.layout.fits({tensor.name: size}):
                region.write(tensor.name, payload)
                _in_region(entry.parameters, region, size, region.layout.offset(tensor.name))
                continue
        request.raw_input_contents.append(payload if isinstance(payload, bytes) else payload.tobytes())
    for want in outputs:
        entry = request.outputs.add(name=want.name)
        if region is not None:
            _in_region(entry.parameters, region, want.nbytes, region.layout.offset(want.name))
    return request


def output_shape(response: service_pb2.ModelInferResponse, name: str) -> list[int] | None:
    """The shape Triton gave output `name`; None when the answer has no such output."""
    for output in response.outputs:
        if output.name == name:
            return list(output.shape)
    return None


def output_array(response: service_pb2.ModelInferResponse, name: str) -> np.ndarray | None:
    """Output `name` from the answer's raw contents (a call without a region), in Triton's dtype and shape."""
    for index, output in enumerate(response.outputs):
        if output.name == name:
            if index >= len(response.raw_output_contents):
                return np.empty(0, dtype=triton_to_np_dtype(output.datatype))
            raw = response.raw_output_contents[index]
            return np.frombuffer(raw, dtype=triton_to_np_dtype(output.datatype)).reshape(list(output.shape))
    return None


def rpc_failure(error: grpc.RpcError) -> InferenceServerException:
    """A failed gRPC call as tritonclient's client reports it (status "StatusCode.X", Triton's message)."""
    return InferenceServerException(msg=error.details(), status=str(error.code()),  # type: ignore[attr-defined]
                                    debug_details=error.debug_error_string())  # type: ignore[attr-defined]
