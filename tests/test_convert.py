"""The one converter between numpy and torch: every dtype both sides hold, no unsafe alias."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onnx_sbs_nb.convert import convert, to_numpy, to_torch

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
    *(
        getattr(torch, n)
        for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
        if hasattr(torch, n)
    ),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_keeps_dtype_and_bits(dtype):
    t = (torch.arange(-6, 6, dtype=torch.float32) / 3).reshape(3, 4).to(dtype)
    a = to_numpy(t)
    back = to_torch(a)
    assert back.dtype == dtype
    assert torch.equal(back.view(torch.uint8), t.contiguous().view(torch.uint8))
    assert convert(t, "numpy").shape == (3, 4) and convert(a, "torch").dtype == dtype


def test_read_only_arrays_are_copied_and_negative_strides_work():
    a = np.arange(6, dtype=np.float32)
    a.flags.writeable = False
    t = to_torch(a)
    t += 1  # must not write into the read-only buffer
    assert a[0] == 0 and t[0] == 1
    rev = np.arange(5, dtype=np.int64)[::-1]
    assert to_torch(rev).tolist() == [4, 3, 2, 1, 0]
    assert to_torch(np.float32(2.5)).shape == ()


def test_writable_arrays_share_memory():
    a = np.zeros(4, dtype=np.float32)
    to_torch(a)[0] = 7
    assert a[0] == 7


def test_strings_and_scalars():
    with pytest.raises(TypeError, match="string"):
        to_torch(np.array(["a"]))
    assert to_torch(3).item() == 3 and to_numpy(2.0).item() == 2.0
    assert [x.tolist() for x in to_numpy([torch.ones(1), torch.zeros(1)])] == [[1.0], [0.0]]


@pytest.mark.parametrize(
    "dtype",
    ["float32", "float64", "float16", "bool", "int8", "int16", "int32", "int64", "uint8"]
    + ["uint16", "uint32", "uint64", "bfloat16", "int4"],
)
def test_tensor_array_is_onnx_to_array(dtype):
    """The raw bytes read straight (numpy types) or by onnx (the others, typed fields):
    the same values, type, shape and read-only flag as numpy_helper.to_array."""
    import onnx
    import onnx.helper as oh
    from onnx import numpy_helper

    from onnx_sbs_nb.convert import tensor_array

    values = (np.arange(24) % 7 - 3).reshape(2, 3, 4)
    if dtype == "bfloat16":
        t = oh.make_tensor("b", onnx.TensorProto.BFLOAT16, [2, 3, 4], values.ravel() / 2)
    elif dtype == "int4":
        t = oh.make_tensor("i", onnx.TensorProto.INT4, [2, 3, 4], values.ravel())
    else:
        t = numpy_helper.from_array(values.astype(dtype), "w")
    typed = oh.make_tensor("typed", onnx.TensorProto.FLOAT, [2, 3], [1, 2, 3, 4, 5, 6])
    for tensor in (t, typed):
        want, got = numpy_helper.to_array(tensor), tensor_array(tensor)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.flags.writeable == want.flags.writeable
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
