"""Tensor attributes read as Python values: .shape, .size(), .dim(), .ndim, .dtype, .device, .T,
.numel(), .is_cuda, .requires_grad, .is_floating_point(), .element_size(); assert on shapes."""
import torch

from corpus import case, rand, x48, xy48, x48_t


@case(x48)
def shape_attrs(x):
    b, n = x.shape
    return x.reshape(b * n) * x.size(0) + x.size()[1] + x.size(-1)


@case(x48)
def dim_ndim_numel(x):
    return x * (x.dim() + x.ndim + x.numel())


@case(lambda: (rand(4, 8, dtype=torch.float16),), dtype=torch.float16)
def dtype_attr(x):
    y = x.to(torch.float32) if x.dtype == torch.float16 else x
    return y * (2 if y.dtype is torch.float32 else 3)


@case(x48)
def device_attr(x):
    z = torch.zeros(x.shape, device=x.device, dtype=x.dtype)
    if x.device.type == "cpu" and not x.is_cuda:
        z = z + 1
    return x + z


@case(x48_t)
def transpose_attr(x):
    return x.T @ x + x.mT.sum()


@case(x48)
def requires_grad_attr(x):
    return x * 2 if not x.requires_grad else x


@case(lambda: (rand(2, 3, 4),))
def shape_arithmetic(x):
    b, *rest = x.shape
    flat = x.reshape(b, -1)
    assert flat.shape[1] == rest[0] * rest[1]
    return flat.view(x.size(0), x.size(1), x.size(2))


@case(x48)
def assert_on_shapes(x):
    assert x.dim() == 2, "expected a matrix"
    assert x.shape[-1] % 4 == 0
    assert x.dtype in (torch.float32, torch.float16)
    return x + 1


@case(x48)
def is_floating_point_etc(x):
    n = x.is_floating_point() + x.is_contiguous() + x.element_size() + x.is_complex()
    return x * n


@case(x48_t)
def contiguity_attr(x):
    if not x.is_contiguous():
        x = x.contiguous()
    return x * 2


@case(lambda: (rand(2, 3, 4),))
def size_tuple_ops(x):
    new_shape = x.shape[:-1] + (2, 2)
    return x.reshape(new_shape) + x.reshape(*x.shape[:1], -1).sum()


@case(x48)
def new_tensor_factories(x):
    return x.new_zeros(x.shape) + x.new_ones((4, 8)) * 2 + torch.ones_like(x) + torch.full_like(x, 3.0)


@case(lambda: (rand(4, 8, dtype=torch.bfloat16),), dtype=torch.bfloat16)
def bf16_dtype_logic(x):
    acc_dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    return (x.to(acc_dtype) * 2).to(x.dtype)


@case(xy48)
def shape_comparisons(x, y):
    if x.shape == y.shape and x.size() == (4, 8) and list(x.shape) == [4, 8]:
        return x + y
    return x - y


@case(x48)
def dim_based_reshape(x):
    dims = list(range(x.dim()))
    dims.reverse()
    return x.permute(dims)


@case(x48)
def shape_in_fstring(x):
    tag = f"{tuple(x.shape)}"
    return x * len(tag)
