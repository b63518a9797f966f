"""bench/codec.py runs (a few calls per way): hot_path and run_all report its table."""

from __future__ import annotations

from bench import codec


def test_the_codec_bench_measures_every_hot_event_each_way() -> None:
    results = codec.measure(number=3, repeat=1)
    assert list(results) == list(codec.HOT)
    for event_type, ways in results.items():
        expected = {"decode", "validate_json", "own record", "encode"}
        if event_type != "delivery.requested":
            expected |= {"verify", "sign"}
        assert expected <= set(ways)
        assert all(us >= 0 for us in ways.values())
    assert "| own record |" in codec.table(results)
