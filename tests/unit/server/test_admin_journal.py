"""server/admin_journal.py over one journal file, two "workers" in one process (fake runtimes that
record what they are asked to apply): journal order, failures not recorded, a rollback recorded
as the version it resolved to, a starting worker replays all but reloads."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from server.admin_journal import AdminJournal


class FakeRuntime:
    """apply_admin records (kind, name, version); ``fail`` names a kind that raises; rollback
    without a version lands on step ``previous``."""

    def __init__(self, fail: str | None = None, previous: int = 7) -> None:
        self.applied: list[tuple[str, str, int | None]] = []
        self.fail = fail
        self.previous = previous
        self.served = SimpleNamespace(full_step=3, delta_step=-1)

    def apply_admin(self, kind, name, version, caller="-", routing=None):
        if kind == self.fail:
            raise ValueError(f"{kind} refused")
        self.applied.append((kind, name, version))
        if kind == "rollback":
            self.served = SimpleNamespace(full_step=version if version is not None else self.previous, delta_step=-1)
        return {"action": kind}

    def model(self, name):
        return SimpleNamespace(served_version=lambda: self.served)


def entries(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_actions_apply_in_journal_order_in_every_worker(tmp_path):
    path = tmp_path / "admin.jsonl"
    a_rt, b_rt = FakeRuntime(), FakeRuntime()
    a, b = AdminJournal(path, a_rt), AdminJournal(path, b_rt)
    assert a.submit("pin", "m", 5, "client") == {"action": "pin"}
    b.submit("pin", "m", 6, "client")  # b catches up with a's pin first, then applies its own
    assert b_rt.applied == [("pin", "m", 5), ("pin", "m", 6)]
    a.submit("unpin", "m", None, "client")
    assert a_rt.applied == [("pin", "m", 5), ("pin", "m", 6), ("unpin", "m", None)]
    assert [e["action"] for e in entries(path)] == ["pin", "pin", "unpin"]


def test_a_failed_action_is_not_recorded(tmp_path):
    path = tmp_path / "admin.jsonl"
    journal = AdminJournal(path, FakeRuntime(fail="pin"))
    with pytest.raises(ValueError, match="pin refused"):
        journal.submit("pin", "m", 99, "client")
    assert path.read_text() == ""


def test_a_rollback_is_recorded_as_the_version_it_reached(tmp_path):
    path = tmp_path / "admin.jsonl"
    AdminJournal(path, FakeRuntime(previous=7)).submit("rollback", "m", None, "client")
    assert entries(path)[0]["version"] == 7
    other = FakeRuntime(previous=2)  # another history: the journal's version wins
    AdminJournal(path, other).start()
    assert other.applied == [("rollback", "m", 7)]


def test_a_starting_worker_replays_all_but_reloads(tmp_path):
    path = tmp_path / "admin.jsonl"
    first = AdminJournal(path, FakeRuntime())
    for kind, version in (("reload", None), ("pin", 4), ("reload", None), ("unpin", None), ("pin", 5)):
        first.submit(kind, "m", version, "client")
    late = FakeRuntime()
    AdminJournal(path, late).start()
    assert late.applied == [("pin", "m", 4), ("unpin", "m", None), ("pin", "m", 5)]


def test_a_worker_where_an_entry_fails_goes_on(tmp_path):
    path = tmp_path / "admin.jsonl"
    writer = AdminJournal(path, FakeRuntime())
    writer.submit("pin", "m", 4, "client")
    writer.submit("unpin", "m", None, "client")
    reader_rt = FakeRuntime(fail="pin")
    reader = AdminJournal(path, reader_rt)
    reader.start()  # the pin fails here (logged), the unpin still applies
    assert reader_rt.applied == [("unpin", "m", None)]
