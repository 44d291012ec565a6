"""Patch documents as the Kubernetes API server applies them (RFC 7386 merge, RFC 6902 JSON patch).

Strategic-merge and server-side-apply patches are applied as merge patches: the emulator has no
schema to know list merge keys, so lists are replaced wholesale, as in a merge patch.
"""

from __future__ import annotations

import copy
from typing import Any

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
PATCH_TYPES = frozenset({MERGE, STRATEGIC, JSON_PATCH, APPLY})


class PatchError(ValueError):
    """A patch that cannot be applied (the API server answers 422)."""


class PatchFormatError(ValueError):
    """A patch body that is not a patch of its declared type (the API server answers 400)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """Return ``target`` merged with ``patch`` per RFC 7386: ``null`` removes a key, lists replace."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchFormatError(f"invalid JSON pointer: {pointer!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")]


def _index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index: {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise PatchError(f"array index out of range: {index}")
    return index


def _parent(doc: Any, pointer: str) -> tuple[Any, str]:
    tokens = _tokens(pointer)
    if not tokens:
        raise PatchError("the whole document cannot be a patch target here")
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise PatchError(f"doc is missing path: {pointer}")
    return node, tokens[-1]


def _get(doc: Any, pointer: str) -> Any:
    node = doc
    for token in _tokens(pointer):
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise PatchError(f"doc is missing path: {pointer}")
    return node


def _add(doc: Any, pointer: str, value: Any) -> Any:
    if pointer == "":
        return value
    parent, token = _parent(doc, pointer)
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, allow_end=True), value)
    else:
        raise PatchError(f"doc is missing path: {pointer}")
    return doc


def _remove(doc: Any, pointer: str) -> Any:
    parent, token = _parent(doc, pointer)
    if isinstance(parent, dict) and token in parent:
        return parent.pop(token)
    if isinstance(parent, list):
        return parent.pop(_index(parent, token, allow_end=False))
    raise PatchError(f"doc is missing path: {pointer}")


def json_patch(doc: Any, ops: Any) -> Any:
    """Return a copy of ``doc`` with the RFC 6902 operations applied; a failed ``test`` raises."""
    if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
        raise PatchFormatError("a JSON patch must be a list of operation objects")
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, path = op.get("op"), op.get("path")
        if not isinstance(path, str):
            raise PatchFormatError(f"operation without a path: {op!r}")
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchFormatError(f"operation without a value: {op!r}")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # the target must exist
            value = copy.deepcopy(op["value"])
            if path == "":
                doc = value
            else:
                parent, token = _parent(doc, path)
                if isinstance(parent, list):
                    parent[_index(parent, token, allow_end=False)] = value
                else:
                    parent[token] = value
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise PatchFormatError(f"operation without 'from': {op!r}")
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise PatchError(f"testing value {path} failed")
        else:
            raise PatchFormatError(f"unknown JSON patch operation: {kind!r}")
    return doc


def apply_patch(content_type: str, doc: dict[str, Any], patch: Any) -> Any:
    """Apply a PATCH body of the given content type to a copy of ``doc`` and return the result."""
    if content_type == JSON_PATCH:
        return json_patch(doc, patch)
    if content_type in PATCH_TYPES:
        if not isinstance(patch, dict):
            raise PatchFormatError("a merge patch must be a JSON object")
        return merge_patch(copy.deepcopy(doc), patch)
    raise PatchFormatError(f"unsupported patch content type: {content_type!r}")
