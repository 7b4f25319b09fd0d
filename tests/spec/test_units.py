"""Quantities with units read as the decimal (and binary) multiples they name, by hand arithmetic."""

from __future__ import annotations

import pytest

from pipesim.errors import ConfigError
from pipesim.spec.units import parse_bandwidth, parse_duration, parse_size


@pytest.mark.parametrize(("text", "bytes_per_s"), [("25Gbit/s", 25e9 / 8), ("400Gbit/s", 50e9), ("100Mbit/s", 12.5e6),
                                                   ("300GB/s", 300e9), ("1.5TB/s", 1.5e12), ("8bit/s", 1.0)])
def test_bandwidths_are_bytes_per_second(text: str, bytes_per_s: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(bytes_per_s, rel=1e-15)


@pytest.mark.parametrize(("text", "seconds"), [("5us", 5e-6), ("1.5ms", 1.5e-3), ("20ns", 2e-8), ("2s", 2.0)])
def test_durations_are_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-15)


@pytest.mark.parametrize(("text", "num_bytes"), [("80GB", 80e9), ("80GiB", 80 * 2**30), ("512MiB", 2**29),
                                                 ("1.5TB", 1.5e12), ("64KB", 64e3)])
def test_sizes_are_bytes(text: str, num_bytes: float) -> None:
    assert parse_size(text) == pytest.approx(num_bytes, rel=1e-15)


def test_a_unit_of_another_kind_is_refused_naming_the_accepted_ones() -> None:
    with pytest.raises(ConfigError, match=r"bandwidth='25Gb': unknown unit 'Gb'; accepted: B/s, KB/s"):
        parse_bandwidth("25Gb")


def test_a_duration_in_a_unit_below_a_second_reads_as_the_decimal_written() -> None:
    """5us is 5e-06, as a table or trace then shows it (5 x 1e-6 read as 4.9999999999999996e-06)."""
    assert repr(parse_duration("5us")) == "5e-06" and repr(parse_duration("20us")) == "2e-05"
    assert repr(parse_duration("1.5ms")) == "0.0015" and repr(parse_duration("7ns")) == "7e-09"
    assert parse_duration("2s") == 2.0 and parse_duration("0us") == 0.0
