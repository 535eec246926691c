"""MyCube: returns x**3 and its derivative, so that double backward works through the dx output."""

from torch.autograd import Function


class MyCube(Function):
    """Outputs (x**3, 3x**2); saving dx as an output keeps the second derivative in the graph."""

    @staticmethod
    def forward(ctx, x):
        result = x ** 3
        dx = 3 * x ** 2
        ctx.save_for_backward(x, dx)
        return result, dx

    @staticmethod
    def backward(ctx, grad_output, grad_dx):
        x, dx = ctx.saved_tensors
        return grad_output * dx + grad_dx * 6 * x


def my_cube(x):
    """x**3 through MyCube; the dx output is only there for double backward."""
    result, _ = MyCube.apply(x)
    return result
