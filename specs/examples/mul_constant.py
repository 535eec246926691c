"""MulConstant from the autograd notebook: the correct one and the notebook's buggy backward."""

from torch.autograd import Function


class MulConstant(Function):
    """y = constant * tensor; the constant is a Python number, so its gradient is None."""

    @staticmethod
    def forward(ctx, tensor, constant):
        ctx.constant = constant
        return tensor * constant

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * ctx.constant, None


class MulConstantUnscaled(Function):
    """The notebook's version: backward forgets to multiply by the constant."""

    @staticmethod
    def forward(ctx, tensor, constant):
        ctx.constant = constant
        return tensor * constant

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None
