import threading

from processor.engine.lane_policy import LanePolicy


def test_rr_hands_lanes_out_in_turn():
    p = LanePolicy("RR", 3)
    assert [p.pick() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_mod_keeps_a_thread_on_its_lane():
    p = LanePolicy("MOD", 4)
    seen: dict[int, set] = {}

    def worker(i):
        seen[i] = {p.pick() for _ in range(50)}

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(lanes) == 1 for lanes in seen.values())
    assert set().union(*seen.values()) == {0, 1, 2, 3}


def test_single_lane_is_always_zero():
    assert {LanePolicy("RR", 1).pick() for _ in range(5)} == {0}
