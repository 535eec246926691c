"""The JSON report: Report.to_dict() with a schema_version (schema in gradtool/schemas/)."""

from __future__ import annotations

import json

from ..results import Report


def render_json(report: Report) -> str:
    """Every target, case and check with outcomes, numbers, diagnosis, seed, config, versions;
    each check's warnings (findings of severity warning, with their rule ids) listed apart."""
    data = report.to_dict()
    data["time"] = report.time_parts()  # where duration_s went: checks, case setup, the run's own
    for target in data["targets"]:
        for case in target["cases"]:
            for check in case["checks"]:
                check["warnings"] = [f for f in check["findings"] if f["severity"] == "warning"]
    return json.dumps(data, indent=2, sort_keys=False)
