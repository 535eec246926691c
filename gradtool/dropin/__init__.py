"""The gradcheck drop-in: gradtool.gradcheck / gradgradcheck with torch's signatures and contract."""

from .functions import GradcheckFailure, gradcheck, gradgradcheck

__all__ = ["GradcheckFailure", "gradcheck", "gradgradcheck"]
