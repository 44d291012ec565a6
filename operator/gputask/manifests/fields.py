"""Field errors worded as the API server words them (``k8s.io/apimachinery/pkg/util/validation/field``).

``spec.template.spec.restartPolicy: Unsupported value: "Always": supported values: "OnFailure",
"Never"``: a path, a type, the value, a detail. Used by the operator's own validation of GPUTask
pod templates (so its ``InvalidSpec`` messages read like the server's), and by the emulator and
the CRD rules to refuse what the server refuses, in the server's words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils import parse_quantity

REQUIRED = "Required value"
FORBIDDEN = "Forbidden"
INVALID = "Invalid value"
NOT_SUPPORTED = "Unsupported value"
NOT_FOUND = "Not found"
DUPLICATE = "Duplicate value"
_NO_VALUE = object()
_CAUSES = {
    REQUIRED: "FieldValueRequired",
    FORBIDDEN: "FieldValueForbidden",
    NOT_SUPPORTED: "FieldValueNotSupported",
    NOT_FOUND: "FieldValueNotFound",
    DUPLICATE: "FieldValueDuplicate",
}


QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
"""What the API server's ``resource.ParseQuantity`` accepts (k8s.io/apimachinery/pkg/api/resource); Python's
Decimal, under ``kubernetes.utils.parse_quantity``, also takes "NaN", " 1" and "1_0"."""


def kube_quantity(value: Any) -> Decimal:
    """A quantity as the API server reads it (a string matching :data:`QUANTITY`, or a finite JSON number);
    raises ValueError with the server's wording otherwise."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, str) and not QUANTITY.fullmatch(value):
        raise ValueError(f"{value!r}: quantities must match the regular expression '{QUANTITY.pattern}'")
    try:
        amount = Decimal(parse_quantity(value))
    except (ValueError, TypeError, InvalidOperation, OverflowError) as exc:
        raise ValueError(f"{value!r} is not a quantity ({exc})") from None
    if not amount.is_finite():
        raise ValueError(f"{value!r} is not a quantity")
    return amount


@dataclass(frozen=True, slots=True)
class FieldError:
    """One refusal, as ``k8s.io/apimachinery``'s ``field.Error``: path, type, value, detail."""

    field: str
    type: str
    detail: str = ""
    value: Any = _NO_VALUE

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"

    @property
    def body(self) -> str:
        """The error without its field path (``field.Error.ErrorBody``): type, value, detail."""
        body = self.type
        if self.value is not _NO_VALUE and self.type not in (REQUIRED, FORBIDDEN):
            body += f": {_render(self.value)}"
        return f"{body}: {self.detail}" if self.detail else body

    @property
    def cause_reason(self) -> str:
        """The ``metav1.StatusCause`` reason of this error (FieldValueRequired, ...)."""
        return _CAUSES.get(self.type, "FieldValueInvalid")


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def aggregate(errors: list[FieldError]) -> str:
    """The errors as the API server joins them in a Status message: one alone, else ``[a, b]``."""
    texts = [str(e) for e in errors]
    return texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"


def not_supported(path: str, value: Any, allowed: tuple[str, ...]) -> FieldError:
    """``Unsupported value: "x": supported values: "a", "b"``."""
    return FieldError(path, NOT_SUPPORTED, "supported values: " + ", ".join(f'"{a}"' for a in allowed), value)
