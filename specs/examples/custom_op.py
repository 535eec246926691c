"""A custom op registered with torch.library.custom_op: a scaled softplus, and a twin whose
backward forgets the scale (namespace gradtool_examples, unique to this file)."""

import torch
from torch.library import custom_op


@custom_op("gradtool_examples::scaled_softplus", mutates_args=())
def scaled_softplus(x: torch.Tensor, scale: float = 3.0) -> torch.Tensor:
    """scale * log(1 + exp(x)): the kernel a C++/CUDA/Triton author would ship."""
    return scale * torch.nn.functional.softplus(x)


@scaled_softplus.register_fake
def _(x, scale=3.0):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * ctx.scale * torch.sigmoid(x), None


scaled_softplus.register_autograd(_backward, setup_context=_setup)


@custom_op("gradtool_examples::softplus_unscaled_grad", mutates_args=())
def softplus_unscaled_grad(x: torch.Tensor, scale: float = 3.0) -> torch.Tensor:
    return scale * torch.nn.functional.softplus(x)


@softplus_unscaled_grad.register_fake
def _(x, scale=3.0):
    return torch.empty_like(x)


def _backward_unscaled(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * torch.sigmoid(x), None  # forgets ctx.scale


softplus_unscaled_grad.register_autograd(_backward_unscaled, setup_context=_setup)
