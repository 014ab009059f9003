"""ai.onnx.ml operators with numeric tensors: LabelEncoder (numeric keys and values),
ArrayFeatureExtractor, Binarizer, Normalizer, Scaler, OneHotEncoder (integer categories).

String tensors have no torch dtype, so the string variants are not supported.
"""

from __future__ import annotations

import torch

from ..registry import op

ML = "ai.onnx.ml"


@op("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(x, indices):
    idx = indices.reshape(-1).to(torch.int64).to(x.device)
    y = x.index_select(x.dim() - 1, idx)
    # onnxruntime returns a one-row matrix for a vector input
    return y.reshape(1, -1) if x.dim() == 1 else y


@op("Binarizer", since=1, domain=ML)
def binarizer(x, threshold=0.0):
    return (x > threshold).to(x.dtype)


@op("Normalizer", since=1, domain=ML)
def normalizer(x, norm="MAX"):
    xf = x.to(torch.float32) if not x.dtype.is_floating_point else x
    if xf.dim() == 1:
        xf = xf.reshape(1, -1)
    if norm == "MAX":
        d = xf.abs().amax(1, keepdim=True)
    elif norm == "L1":
        d = xf.abs().sum(1, keepdim=True)
    elif norm == "L2":
        d = torch.sqrt((xf * xf).sum(1, keepdim=True))
    else:
        raise ValueError(f"Normalizer: unknown norm {norm!r}")
    return (xf / d.clamp(min=1e-30)).to(torch.float32)


@op("Scaler", since=1, domain=ML)
def scaler(x, offset=None, scale=None):
    xf = x.to(torch.float32)
    if offset is not None:
        xf = xf - torch.tensor(list(offset), dtype=torch.float32, device=x.device)
    if scale is not None:
        xf = xf * torch.tensor(list(scale), dtype=torch.float32, device=x.device)
    return xf


@op("OneHotEncoder", since=1, domain=ML)
def one_hot_encoder(x, cats_int64s=None, cats_strings=None, zeros=1):
    if not cats_int64s:
        raise NotImplementedError("OneHotEncoder: string categories are not supported")
    cats = torch.tensor(list(cats_int64s), dtype=torch.int64, device=x.device)
    y = (x.to(torch.int64).unsqueeze(-1) == cats).to(torch.float32)
    if not zeros and bool((y.sum(-1) == 0).any()):
        raise ValueError("OneHotEncoder: a value matches no category and zeros=0")
    return y


def _lookup(x, keys: torch.Tensor, values: torch.Tensor, default) -> torch.Tensor:
    keys = keys.to(x.device)
    values = values.to(x.device)
    order = torch.argsort(keys)
    sk, sv = keys[order], values[order]
    xk = x.to(sk.dtype)
    pos = torch.searchsorted(sk, xk.reshape(-1)).clamp(max=max(sk.numel() - 1, 0)).reshape(x.shape)
    found = sk[pos] == xk if sk.numel() else torch.zeros_like(xk, dtype=torch.bool)
    if sk.dtype.is_floating_point:
        # NaN keys match NaN inputs, as onnxruntime does
        found = found | (torch.isnan(sk[pos]) & torch.isnan(xk))
    d = default if isinstance(default, torch.Tensor) else torch.tensor(default, dtype=sv.dtype)
    return torch.where(found, sv[pos], d.to(sv.dtype).to(x.device))


def _numeric(vals, dtype):
    if vals is None or (not isinstance(vals, torch.Tensor) and len(vals) == 0):
        return None
    if isinstance(vals, torch.Tensor):
        return vals.reshape(-1)
    if isinstance(vals[0], str):
        raise NotImplementedError("LabelEncoder: string keys or values are not supported")
    return torch.tensor(list(vals), dtype=dtype)


@op("LabelEncoder", since=1, domain=ML)
def label_encoder_1(x, classes_strings=None, default_int64=-1, default_string="_Unused"):
    raise NotImplementedError("LabelEncoder-1 maps strings, which the torch evaluator cannot hold")


@op("LabelEncoder", since=2, domain=ML)
def label_encoder(
    x,
    default_float=-0.0,
    default_int64=-1,
    default_string="_Unused",
    default_tensor=None,
    keys_floats=None,
    keys_int64s=None,
    keys_strings=None,
    keys_tensor=None,
    values_floats=None,
    values_int64s=None,
    values_strings=None,
    values_tensor=None,
):
    if keys_strings or values_strings:
        raise NotImplementedError("LabelEncoder: string keys or values are not supported")
    keys = _numeric(keys_tensor, None)
    if keys is None:
        keys = _numeric(keys_floats, torch.float32)
    if keys is None:
        keys = _numeric(keys_int64s, torch.int64)
    values = _numeric(values_tensor, None)
    default: object
    if values is not None:
        default = (
            default_tensor.reshape(())
            if default_tensor is not None
            else torch.zeros((), dtype=values.dtype)
        )
    elif values_floats:
        values, default = _numeric(values_floats, torch.float32), default_float
    else:
        values, default = _numeric(values_int64s, torch.int64), default_int64
    if keys is None or values is None:
        raise ValueError("LabelEncoder: keys and values must be given")
    return _lookup(x, keys, values, default)
