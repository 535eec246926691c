"""LegendrePolynomial3: P3(x) = (5x^3 - 3x) / 2, the tutorial's custom Function."""

from torch.autograd import Function


class LegendrePolynomial3(Function):
    """P3 and its derivative 1.5 (5x^2 - 1), written with tensor ops so double backward works."""

    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return 0.5 * (5 * input ** 3 - 3 * input)

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        return grad_output * 1.5 * (5 * input ** 2 - 1)
