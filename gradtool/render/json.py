"""The JSON report: Report.to_dict() with a schema_version (schema in gradtool/schemas/)."""

from __future__ import annotations

import json

from ..results import Report


def render_json(report: Report) -> str:
    """Every target, case and check with outcomes, numbers, diagnosis, seed, config, versions."""
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)
