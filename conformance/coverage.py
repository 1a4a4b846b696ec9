"""Which ops of onnx's schemas the reference covers, per version: directly or by function body."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import onnx.defs

from reference.registry import canonical_domain, lookup, registered


@dataclass
class OpCoverage:
    domain: str
    op_type: str
    versions: list[int]
    direct: list[int] = field(default_factory=list)
    function: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)


def coverage(domain: str | None = None) -> list[OpCoverage]:
    import reference.ops  # noqa: F401  (registers the ops)

    schemas = defaultdict(dict)
    for s in onnx.defs.get_all_schemas_with_history():
        schemas[(canonical_domain(s.domain), s.name)][s.since_version] = s
    rows = []
    for (dom, name), by_version in sorted(schemas.items()):
        if domain is not None and dom != canonical_domain(domain):
            continue
        row = OpCoverage(dom, name, sorted(by_version))
        for version, schema in sorted(by_version.items()):
            impl = lookup(dom, name, version)
            if impl is not None:
                row.direct.append(version)
            elif schema.function_opset_versions or schema.context_dependent_function_opset_versions \
                    or schema.has_function or schema.has_context_dependent_function:
                row.function.append(version)
            else:
                row.missing.append(version)
        rows.append(row)
    for (dom, name), impls in sorted(registered().items()):
        if (dom, name) not in schemas and (domain is None or dom == canonical_domain(domain)):
            versions = [i.since for i in impls]
            rows.append(OpCoverage(dom, name, versions, direct=versions))
    return rows
