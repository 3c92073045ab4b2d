"""Tuple unpacking (with starred targets), slicing and indexing of tensors with slices, ints,
None, ..., negative steps-free slices, tensors and lists; indexing of Python containers."""
import torch

from corpus import case, rand, x48, xy48, x48_t


@case(lambda: (rand(4, 8, 6),))
def basic_slices(x):
    return x[1:3, ::2, -2:] + x[:2, 1:8:2, 0:2]


@case(lambda: (rand(4, 8, 6),))
def int_index(x):
    return x[0] + x[-1] + x[:, 2].unsqueeze(0)[:, None, :].squeeze(1).sum(1)


@case(lambda: (rand(4, 8, 6),))
def none_and_ellipsis(x):
    return x[..., 0] + x[None, ..., 1].squeeze(0) + x[:, None, :, 2].sum(1)


@case(x48_t)
def index_noncontiguous(x):
    return x[1:, :3] * 2


@case(lambda: (rand(5, 8), torch.tensor([0, 2, -1]), torch.tensor([[1, 0], [3, 4]])))
def tensor_index(x, idx, idx2):
    return x[idx] + x[idx, :][:, 1:2], x[:, idx2], x[..., idx]


@case(x48)
def list_index(x):
    return x[[0, 3, 1]]


@case(lambda: (rand(4, 8), rand(4, 8) > 0))
def bool_mask_where(x, m):
    return torch.where(m, x, -x)


@case(x48)
def tuple_unpack(x):
    a, b = x.chunk(2, dim=1)
    (c, d), e = (a, b), a * b
    return c + d + e


@case(lambda: (rand(6, 8),))
def starred_unpack(x):
    first, *middle, last = x.split(2, dim=0)
    return first + last + middle[0]


@case(lambda: (rand(6, 8),))
def starred_in_call_and_build(x):
    parts = x.unbind(0)
    head, *tail = parts
    return torch.stack([*tail, head]) + torch.stack((head, *tail))


@case(xy48)
def swap_unpack(x, y):
    x, y = y, x
    a, b, c = x, y, x
    return a - b + c


@case(x48)
def container_indexing(x):
    lst = [x, x * 2, x * 3]
    tup = (1, 2, 3)
    d = {"k": lst[1:]}
    return d["k"][-1] + lst[tup[0]] + lst[-3]


@case(x48)
def negative_dims(x):
    return x.sum(-1, keepdim=True) + x.mean(dim=-2) + x.transpose(-1, -2).T


@case(lambda: (rand(2, 3, 4, 5),))
def multi_dim_slice_assign_free(x):
    y = x[:, 1:, ::2, 2:4]
    return y.flatten(1) + 0


@case(x48)
def setitem_on_local_tensor(x):
    y = x.clone()
    y[0] = 1.0
    y[:, 1:3] = x[:, :2] * 2
    return y


@case(x48)
def narrow_select_index_select(x):
    return x.narrow(1, 2, 3).select(0, 1) + x.index_select(1, torch.tensor([0, 1, 2]))[2]


@case(x48)
def getitem_slices_of_shape(x):
    rows = x.shape[0]
    return x[: rows // 2] - x[rows // 2:]
