"""Given tensors of any layout (size-1 dimensions with any stride, expanded, overlapping, views of
views, 0-d, empty, conjugate and negative bits) never raise gradtool's own error: through
gradtool.check they are checked; through gradtool.gradcheck, torch's verdict or refusal."""

from __future__ import annotations

import sys

import pytest
import torch

import gradtool
from gradtool.errors import InternalError

GradcheckError = sys.modules["torch.autograd.gradcheck"].GradcheckError
D, C = torch.float64, torch.complex128


def _odd():
    torch.manual_seed(0)
    base = torch.randn(3, 4, dtype=D)
    return {
        "size-1 dim, stride 4": torch.randn(1, 4, dtype=D)[:, 0],
        "size-1 dims, any strides": torch.randn(5, 1, 3, dtype=D)[1:2, :, ::2],
        "expanded": torch.randn(1, 3, dtype=D).expand(4, 3),
        "overlapping": torch.randn(10, dtype=D).as_strided((4, 3), (1, 1)),
        "view of a view": base.t()[1:, ::2].unsqueeze(0),
        "transposed": base.t(),
        "0-d": torch.tensor(1.5, dtype=D),
        "empty": torch.randn(0, 3, dtype=D),
        "conjugate bit": torch.randn(3, dtype=C).conj(),
        "negative bit": torch.randn(3, dtype=C).conj().imag,
    }


ODD = _odd()


def _given(name):
    return ODD[name].detach().requires_grad_()


def _double(a):
    return a * 2


@pytest.mark.parametrize("name", list(ODD))
def test_check_takes_any_given_layout(name):
    x = _given(name)
    before = x.detach().clone()
    report = gradtool.check(_double, (x,), checks=("gradient", "complex"))
    assert report.ok(), report
    assert torch.equal(x.detach(), before) and x.grad is None


@pytest.mark.parametrize("name", list(ODD))
def test_gradcheck_gives_torchs_verdict_or_refusal_on_any_layout(name):
    def outcome(fn):
        try:
            return fn(_double, (_given(name),))
        except InternalError:
            raise
        except GradcheckError:
            return GradcheckError
        except Exception as exc:  # noqa: BLE001 - torch's refusal: its type is compared
            return type(exc)

    theirs, ours = outcome(torch.autograd.gradcheck), outcome(gradtool.gradcheck)
    if name == "overlapping":
        # torch's finite differences move several elements at once through the shared memory
        # (its own noise: the gradient is right); gradtool perturbs a copy
        assert (theirs, ours) == (GradcheckError, True)
    else:
        assert ours == theirs


def test_a_case_building_error_of_gradtools_own_is_an_internal_error(monkeypatch):
    import types

    from gradtool.targets import values

    # content_hash itself raises (calling None), as the stride-4 view once made it raise
    monkeypatch.setattr(values, "hashlib", types.SimpleNamespace(sha256=None))
    with pytest.raises(InternalError, match="bug in gradtool.*TypeError"):
        gradtool.check(_double, (_given("0-d"),), checks=("gradient",))
