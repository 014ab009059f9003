"""ai.onnx.ml operators: LabelEncoder, TreeEnsemble,
ArrayFeatureExtractor, Binarizer, Normalizer, Scaler, OneHotEncoder.

String tensors have no torch dtype: LabelEncoder's and OneHotEncoder's string sides are
numpy object arrays.
"""

from __future__ import annotations

import numpy as np
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
    if cats_strings and not isinstance(x, torch.Tensor):
        a = np.asarray(x).astype(str)
        y = torch.from_numpy(a[..., None] == np.array(list(cats_strings), dtype=str)).float()
    elif cats_int64s:
        cats = torch.tensor(list(cats_int64s), dtype=torch.int64, device=x.device)
        y = (x.to(torch.int64).unsqueeze(-1) == cats).to(torch.float32)
    else:
        raise ValueError("OneHotEncoder: cats_int64s or cats_strings (string input) is required")
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


def _string_lookup(x, keys: list, values: list, default, dtype: torch.dtype | None = None):
    """LabelEncoder with strings on either side, through a dict (numpy object arrays)."""
    table = dict(zip(keys, values))
    if isinstance(x, torch.Tensor):
        flat, shape = x.reshape(-1).tolist(), tuple(x.shape)
    else:
        a = np.asarray(x)
        flat, shape = [str(v) for v in a.reshape(-1)], a.shape
    out = [table.get(v, default) for v in flat]
    if values and isinstance(values[0], str):
        return np.array(out, dtype=object).reshape(shape)
    if dtype is None:
        dtype = torch.int64 if isinstance(default, int) else torch.float32
    return torch.tensor(out, dtype=dtype).reshape(shape)


@op("LabelEncoder", since=1, domain=ML)
def label_encoder_1(x, classes_strings=None, default_int64=-1, default_string="_Unused"):
    # opset 1 maps strings to their index in classes_strings, and int64 back to strings
    classes = list(classes_strings or [])
    if isinstance(x, torch.Tensor):
        return _string_lookup(x, list(range(len(classes))), classes, default_string)
    return _string_lookup(x, classes, list(range(len(classes))), default_int64)


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
    # string tensors (keys_tensor, values_tensor, default_tensor) come as numpy arrays
    if isinstance(keys_tensor, np.ndarray):
        keys_strings, keys_tensor = [str(k) for k in keys_tensor.reshape(-1)], None
    if isinstance(values_tensor, np.ndarray):
        values_strings, values_tensor = [str(v) for v in values_tensor.reshape(-1)], None
        if isinstance(default_tensor, np.ndarray):
            default_string = str(default_tensor.reshape(-1)[0])
    if keys_strings or values_strings:
        keys = list(keys_strings or [])
        if not keys:
            keys = keys_tensor.reshape(-1).tolist() if keys_tensor is not None else []
            keys = keys or list(keys_int64s or keys_floats or [])
        if values_strings:
            return _string_lookup(x, keys, list(values_strings), default_string)
        if values_tensor is not None:
            d = default_tensor.reshape(-1)[0].item() if default_tensor is not None else 0
            vals = values_tensor.reshape(-1).tolist()
            return _string_lookup(x, keys, vals, d, values_tensor.dtype)
        if values_floats:
            return _string_lookup(x, keys, list(values_floats), float(default_float))
        return _string_lookup(x, keys, list(values_int64s or []), int(default_int64))
    if not isinstance(x, torch.Tensor):
        raise TypeError("LabelEncoder: a string input needs string keys")
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


# TreeEnsemble node modes
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)


def _post_transform(y: torch.Tensor, post_transform: int) -> torch.Tensor:
    if post_transform == 0:
        return y
    if post_transform == 1:
        return torch.softmax(y, -1)
    if post_transform == 2:
        return torch.sigmoid(y)
    if post_transform == 3:  # softmax over the non-zero scores
        e = torch.where(y == 0, torch.zeros_like(y), torch.exp(y - y.amax(-1, keepdim=True)))
        s = e.sum(-1, keepdim=True)
        return e / torch.where(s == 0, torch.ones_like(s), s)
    if post_transform == 4:
        return torch.special.ndtri(y)
    raise ValueError(f"TreeEnsemble: unknown post_transform {post_transform}")


@op("TreeEnsemble", since=5, domain=ML)
def tree_ensemble(
    x,
    aggregate_function=1,
    leaf_targetids=(),
    leaf_weights=None,
    membership_values=None,
    n_targets=None,
    nodes_falseleafs=(),
    nodes_falsenodeids=(),
    nodes_featureids=(),
    nodes_hitrates=None,
    nodes_missing_value_tracks_true=None,
    nodes_modes=None,
    nodes_splits=None,
    nodes_trueleafs=(),
    nodes_truenodeids=(),
    post_transform=0,
    tree_roots=(),
):
    """All rows through all trees at once: one gather/compare step per tree level."""
    dev = x.device

    def ints(v):
        return torch.tensor(list(v), dtype=torch.int64, device=dev)

    modes = nodes_modes.to(dev, torch.int64).reshape(-1)
    splits = nodes_splits.to(dev, x.dtype).reshape(-1)
    feat, t_id, f_id = ints(nodes_featureids), ints(nodes_truenodeids), ints(nodes_falsenodeids)
    t_leaf, f_leaf = ints(nodes_trueleafs).bool(), ints(nodes_falseleafs).bool()
    missing = (
        ints(nodes_missing_value_tracks_true).bool()
        if nodes_missing_value_tracks_true is not None and len(nodes_missing_value_tracks_true)
        else torch.zeros_like(t_leaf)
    )
    weights = leaf_weights.to(dev, x.dtype).reshape(-1)
    targets = ints(leaf_targetids)
    n_nodes = modes.numel()
    # members of each MEMBER node, NaN-padded: values come NaN-separated in node order
    members = torch.full((n_nodes, 1), float("nan"), dtype=x.dtype, device=dev)
    if membership_values is not None:
        groups, cur = [], []
        for v in membership_values.reshape(-1).tolist():
            if v != v:
                groups.append(cur)
                cur = []
            else:
                cur.append(v)
        member_nodes = (modes == _MEMBER).nonzero().reshape(-1).tolist()
        width = max([len(g) for g in groups] + [1])
        members = torch.full((n_nodes, width), float("nan"), dtype=x.dtype)
        for node, g in zip(member_nodes, groups):
            members[node, : len(g)] = torch.tensor(g, dtype=x.dtype)
        members = members.to(dev)
    roots = ints(tree_roots)
    n_rows, n_trees = x.shape[0], roots.numel()
    cur = roots.unsqueeze(0).expand(n_rows, n_trees).clone()
    # a root whose both branches are the same leaf is a single-leaf tree
    done = (t_leaf[cur] & f_leaf[cur] & (t_id[cur] == f_id[cur])).clone()
    cur = torch.where(done, t_id[cur], cur)
    rows = torch.arange(n_rows, device=dev).unsqueeze(1)
    for _ in range(n_nodes + 1):
        if bool(done.all()):
            break
        node = torch.where(done, torch.zeros_like(cur), cur)
        v = x[rows, feat[node]]
        s = splits[node]
        m = modes[node]
        cmp = torch.stack(
            [
                v <= s,
                v < s,
                v >= s,
                v > s,
                v == s,
                v != s,
                (v.unsqueeze(-1) == members[node]).any(-1),
            ]
        )
        go = cmp.gather(0, m.unsqueeze(0)).squeeze(0) | (missing[node] & torch.isnan(v))
        nxt = torch.where(go, t_id[node], f_id[node])
        leaf = torch.where(go, t_leaf[node], f_leaf[node])
        cur = torch.where(done, cur, nxt)
        done = done | leaf
    w = weights[cur]
    tgt = targets[cur]
    n_out = int(n_targets) if n_targets else int(targets.max().item()) + 1
    if aggregate_function in (0, 1):
        y = torch.zeros((n_rows, n_out), dtype=x.dtype, device=dev).scatter_add_(1, tgt, w)
        if aggregate_function == 0:
            y = y / n_trees
    elif aggregate_function in (2, 3):
        big = torch.finfo(x.dtype).max
        init = big if aggregate_function == 2 else -big
        y = torch.full((n_rows, n_out), init, dtype=x.dtype, device=dev)
        y = y.scatter_reduce(1, tgt, w, "amin" if aggregate_function == 2 else "amax")
        # a target no leaf wrote to is 0, as onnxruntime returns (not the initial bound)
        hit = torch.zeros((n_rows, n_out), dtype=torch.bool, device=dev)
        hit.scatter_(1, tgt, True)
        y = torch.where(hit, y, torch.zeros_like(y))
    else:
        raise ValueError(f"TreeEnsemble: unknown aggregate_function {aggregate_function}")
    return _post_transform(y, post_transform)
