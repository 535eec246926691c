"""The op: and import: keys of a spec: a custom op by its registered name, and what registers it."""

from __future__ import annotations

from typing import Any

from ..errors import SpecError
from ..targets.ops import is_qualified
from .values import resolve_location
from .yaml_lines import line_of, show


def op_reference(validator: Any, data: Any, key: str) -> str | None:
    """'LOCATION:ns::name' for load.resolve (LOCATION: the import: file or module), None when
    the spec names no op; errors are recorded on the validator, as every key's are."""
    where = f"{key}." if key else ""
    if "op" not in data or "target" in data:
        if "import" in data:
            validator.error("import: goes with op: (it registers the op named there)",
                            f"{where}import", line_of(data, "import"))
        return None
    text = data["op"]
    if not isinstance(text, str) or not is_qualified(text.strip()) or \
            ":" in text.strip().replace("::", ""):
        validator.error(f"expected an op name ns::name or ns::name.overload, got {show(text)}",
                        f"{where}op", line_of(data, "op"),
                        "e.g. op: mylib::scale_mul with import: ops.py")
        return None
    if "import" not in data:
        return text.strip()
    try:  # the same rules as a target's file or module, checked without importing anything
        location = resolve_location(data["import"], validator.base_dir)
    except SpecError as exc:
        validator.error(exc.message, f"{where}import", line_of(data, "import"), exc.hint)
        return None
    return f"{location}:{text.strip()}"
