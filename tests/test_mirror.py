"""Mirror: a copy replaced whole, never by an older load that finished late."""

from __future__ import annotations

import threading

from gateway.mirror import UNLOADED, Mirror


class Database:
    def __init__(self) -> None:
        self.revision = 0

    def load(self) -> tuple[int, str]:
        return self.revision, f"copy {self.revision}"


def test_an_older_load_that_finishes_late_never_replaces_a_newer_copy() -> None:
    database = Database()
    started, release = threading.Event(), threading.Event()

    def slow_load() -> tuple[int, str]:
        loaded = database.load()  # read before the change below
        started.set()
        release.wait()
        return loaded

    mirror: Mirror[str] = Mirror("prices", slow_load, "")
    late = threading.Thread(target=mirror.reload)
    late.start()
    started.wait()
    database.revision = 1
    assert mirror.install(*database.load())  # the change's own reload, confirmed
    release.set()
    late.join()
    assert (mirror.revision, mirror.value) == (1, "copy 1")


def test_install_calls_back_in_order_and_follow_misses_nothing() -> None:
    seen: list[str] = []
    mirror: Mirror[str] = Mirror("keys", Database().load, "empty")
    mirror.follow(seen.append)
    assert mirror.revision == UNLOADED and seen == ["empty"]
    mirror.install(UNLOADED, "snapshot")  # a snapshot: as unloaded as nothing
    mirror.install(3, "three")
    assert not mirror.install(2, "two")
    mirror.replace(lambda value: value + "!")
    assert seen == ["empty", "snapshot", "three", "three!"] and mirror.revision == 3


def test_the_periodic_reload_follows_a_database_restored_to_an_earlier_revision() -> None:
    database = Database()
    mirror: Mirror[str] = Mirror("keys", database.load, "")
    database.revision = 7
    mirror.reload()
    database.revision = 4  # restored from a backup
    assert mirror.reload() == 7  # a plain reload cannot tell it from a late one
    assert mirror.reload_checked() == 4 and mirror.value == "copy 4"
