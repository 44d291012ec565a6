"""One owner of adapter state: only ``k8s/records.py`` changes a task record's fields.

The check is syntactic (``ast``): in every other module of the adapter, an assignment (``=``, ``+=``, ``del``)
to a field of :class:`~gputask.k8s.records.TaskRecord`, or to an item or field below one, or a mutating call on
one (``record.conditions.pop(...)``), on an expression whose name says it is a record (``record``, ``rec``,
``pending.record``, ``r`` is not enough), is reported. The adapter's code names every TaskRecord so.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from gputask.core import TaskKey
from gputask.k8s import records
from gputask.k8s.records import TaskRecord, TaskRecords

ADAPTER = Path(__file__).resolve().parents[2] / "operator" / "gputask" / "k8s"
OWNER = "records.py"
FIELDS = frozenset(f.name for f in dataclasses.fields(TaskRecord))
MUTATORS = frozenset({"pop", "popitem", "clear", "update", "setdefault", "append", "extend", "remove", "discard",
                      "add", "insert", "sort"})
RECORD_NAME = re.compile(r"(^|_)rec(ord)?s?$|record")


def _names_record(node: ast.expr) -> bool:
    """True when ``node`` is a name, or a field, that says it is a record."""
    if isinstance(node, ast.Name):
        return bool(RECORD_NAME.search(node.id))
    if isinstance(node, ast.Attribute):
        return bool(RECORD_NAME.search(node.attr))
    return False


def _record_field(node: ast.expr) -> str | None:
    """The TaskRecord field a target reaches (``record.f``, ``record.f[k]``, ``record.f.g``), or None."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        inner = node.value
        if isinstance(node, ast.Attribute) and node.attr in FIELDS and _names_record(inner):
            return node.attr
        node = inner
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        found = [node.target]
    elif isinstance(node, ast.Delete):
        found = list(node.targets)
    else:
        return []
    flat: list[ast.expr] = []
    while found:
        each = found.pop()
        if isinstance(each, (ast.Tuple, ast.List)):
            found.extend(each.elts)
        elif isinstance(each, ast.Starred):
            found.append(each.value)
        else:
            flat.append(each)
    return flat


def record_writes(root: Path) -> list[str]:
    """``file:line: field`` for each change of a TaskRecord field outside the owner module, under ``root``."""
    out: list[tuple[str, int, str]] = []
    for path in sorted(root.rglob("*.py")):
        if path.name == OWNER:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            changed = [f for f in map(_record_field, _targets(node)) if f is not None]
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                    and (field := _record_field(node.func.value) or _field_itself(node.func.value)) is not None):
                changed.append(field)
            out += [(str(path.relative_to(root)), getattr(node, "lineno", 0), f) for f in changed]
    return [f"{path}:{line}: {field}" for path, line, field in sorted(out)]


def _field_itself(node: ast.expr) -> str | None:
    """``record.conditions`` itself (a mutating call on it), or None."""
    if isinstance(node, ast.Attribute) and node.attr in FIELDS and _names_record(node.value):
        return node.attr
    return None


def test_only_the_records_module_changes_a_task_record() -> None:
    """No module of the adapter but k8s/records.py assigns, deletes or mutates a TaskRecord field."""
    assert record_writes(ADAPTER) == []


def test_the_check_catches_each_kind_of_planted_write(tmp_path: Path) -> None:
    """Assignments, tuple assignments, augmented ones, items, nested fields and mutating calls are each reported;
    the same writes in records.py and writes to other objects' fields are not."""
    (tmp_path / "bad.py").write_text(
        "record.phase = 'Running'\n"
        "record.job_name, other.x = 'j', 1\n"
        "self.pending.record.attempt += 1\n"
        "record.conditions['Admitted'] = {}\n"
        "record.backoff.failures = 0\n"
        "record.conditions.pop('X', None)\n"
        "record.obj['metadata']['resourceVersion'] = '7'\n"
        "del rec.placement\n"
        "job.attempt = 2\n"
        "deletion.failures += 1\n"
        "x = record.phase\n"
    )
    (tmp_path / OWNER).write_text("record.phase = 'Running'\n")
    assert record_writes(tmp_path) == [
        "bad.py:1: phase",
        "bad.py:2: job_name",
        "bad.py:3: attempt",
        "bad.py:4: conditions",
        "bad.py:5: backoff",
        "bad.py:6: conditions",
        "bad.py:7: obj",
        "bad.py:8: placement",
    ]


def _record() -> TaskRecord:
    return TaskRecords().add(TaskKey("ml/a"), "u1", {"metadata": {"name": "a", "namespace": "ml", "generation": 2}})


def test_a_refused_create_counts_failures_per_spec() -> None:
    """A backoff's failures start over for a new spec (generation) and go on for the same one; a pod-start failure
    counts on without looking at the spec."""
    record = _record()
    assert [records.failed_again(record, per_spec=True) for _ in range(3)] == [1, 2, 3]
    records.converted(record, None)
    record.obj["metadata"]["generation"] = 3
    assert records.queued(record) is True  # a new spec ends the backoff of the old one
    assert (record.backoff.failures, records.failed_again(record, per_spec=True)) == (0, 1)
    assert records.failed_again(record, per_spec=False) == 2


def test_the_index_forgets_a_record_by_key_only_when_it_is_the_same() -> None:
    """A record re-created under the same name stays indexed by key when the old one is forgotten."""
    book = TaskRecords()
    old = book.add(TaskKey("ml/a"), "u1", {"metadata": {"name": "a", "namespace": "ml"}})
    new = book.add(TaskKey("ml/a"), "u2", {"metadata": {"name": "a", "namespace": "ml"}})
    book.forget(old)
    assert (book.tasks, book.by_uid, book.in_namespace) == ({"ml/a": new}, {"u2": new}, {"ml": {"ml/a"}})
